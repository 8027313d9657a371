package bus

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// A bus node that is part of a cluster keeps its membership under $NEXUS_HOME/cluster:
// cluster.json (this file's Cluster), the cluster CA's certificate ca.pem, this node's
// certificate node.pem and key node-key.pem, and on the host that ran `nexus cluster init`
// the CA's key ca-key.pem (it signs the certificates of the hosts that join) and the join
// tokens (tokens.json). Without cluster.json the bus is the single-host loopback bus.

// DefaultRoutePort is where a clustered bus node accepts its peers' routes.
const DefaultRoutePort = 6244

// ClusterReplicas is the replica count of the buckets and streams on three nodes or more.
const ClusterReplicas = 3

// Cluster is one node's cluster membership (cluster.json).
type Cluster struct {
	Name string `json:"name"`
	// Host is this node's host name; the services of this host serve nexus.<svc>.<Host>.*.
	Host string `json:"host"`
	// Advertise is the address (IP or DNS name) the other hosts reach this node at.
	Advertise string `json:"advertise"`
	// Listen is the address the node's client and route ports bind; empty: every interface.
	Listen     string `json:"listen,omitempty"`
	ClientPort int    `json:"client_port"`
	RoutePort  int    `json:"route_port"`
	// Routes are the other nodes' route URLs (nats-route://ADDR:PORT) this node dials.
	Routes []string `json:"routes,omitempty"`
	// Control says this host runs the control plane (gateway, credbroker) and so has their bus
	// users and ops' admin; a worker host's node has only its own host-scoped services' and
	// the CLI's, so a compromised worker cannot drive another host's vmm.
	Control bool `json:"control,omitempty"`
	// RouteUser and RoutePassword authenticate routes, on top of their CA-signed certificates.
	RouteUser     string `json:"route_user"`
	RoutePassword string `json:"route_password"`
}

// ClusterDir is where a home keeps its cluster membership.
func ClusterDir(h home.Dir) string { return filepath.Join(string(h), "cluster") }

func clusterFile(h home.Dir, name string) string { return filepath.Join(ClusterDir(h), name) }

func jetstreamDir(h home.Dir) string { return filepath.Join(h.Bus(), "jetstream") }

// LoadCluster reads this home's membership; ok is false when the home is in no cluster.
func LoadCluster(h home.Dir) (c Cluster, ok bool, err error) {
	b, err := os.ReadFile(clusterFile(h, "cluster.json"))
	if errors.Is(err, os.ErrNotExist) {
		return Cluster{}, false, nil
	}
	if err != nil {
		return Cluster{}, false, fmt.Errorf("cluster: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil || c.Name == "" || c.Host == "" || c.ClientPort == 0 || c.RoutePort == 0 {
		return Cluster{}, false, fmt.Errorf("cluster: %s is damaged", clusterFile(h, "cluster.json"))
	}
	return c, true, nil
}

// SaveCluster writes this home's membership (0600, atomic).
func SaveCluster(h home.Dir, c Cluster) error {
	if err := os.MkdirAll(ClusterDir(h), 0o700); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	b, _ := json.MarshalIndent(c, "", "  ")
	return atomicfile.WriteFile(clusterFile(h, "cluster.json"), append(b, '\n'), 0o600)
}

// RouteURL is the URL the other nodes dial to route to c.
func (c Cluster) RouteURL() string {
	return "nats-route://" + net.JoinHostPort(c.Advertise, strconv.Itoa(c.RoutePort))
}

// ClientURL is the URL a client on another host dials to reach this node.
func (c Cluster) ClientURL() string {
	return "tls://" + net.JoinHostPort(c.Advertise, strconv.Itoa(c.ClientPort))
}

// NewCA makes the cluster CA and writes ca.pem and ca-key.pem under h's cluster directory.
func NewCA(h home.Dir, name string) error {
	if err := os.MkdirAll(ClusterDir(h), 0o700); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "nexus cluster " + name + " CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(clusterFile(h, "ca-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return atomicfile.WriteFile(clusterFile(h, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// NewNodeKey makes this node's key and a certificate request for host reached at addrs.
func NewNodeKey(h home.Dir) (*ecdsa.PrivateKey, error) {
	if err := os.MkdirAll(ClusterDir(h), 0o700); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return key, atomicfile.WriteFile(clusterFile(h, "node-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
}

// SignNode issues, with the CA under h, the certificate of the node host whose public key is
// pub, valid for loopback and addrs (IPs or DNS names), as a server and as a route client.
func SignNode(h home.Dir, host string, addrs []string, pub any) ([]byte, error) {
	caCert, caKey, err := loadCA(h)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "nexus bus " + host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(5, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
		} else if a != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, a)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, pub, caKey)
	if err != nil {
		return nil, fmt.Errorf("cluster: sign the certificate of %s: %w", host, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func loadCA(h home.Dir) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, err := os.ReadFile(clusterFile(h, "ca.pem"))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: no CA on this host (%v): tokens are created and hosts join on the host that ran `nexus cluster init`", err)
	}
	kb, err := os.ReadFile(clusterFile(h, "ca-key.pem"))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: no CA key on this host (%v): tokens are created and hosts join on the host that ran `nexus cluster init`", err)
	}
	cblk, _ := pem.Decode(cb)
	kblk, _ := pem.Decode(kb)
	if cblk == nil || kblk == nil {
		return nil, nil, fmt.Errorf("cluster: the CA under %s is damaged", ClusterDir(h))
	}
	cert, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: the CA under %s is damaged: %v", ClusterDir(h), err)
	}
	key, err := x509.ParseECPrivateKey(kblk.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: the CA key under %s is damaged: %v", ClusterDir(h), err)
	}
	return cert, key, nil
}

// WriteNodeCert stores this node's certificate and the cluster CA it chains to.
func WriteNodeCert(h home.Dir, certPEM, caPEM []byte) error {
	if err := atomicfile.WriteFile(clusterFile(h, "node.pem"), certPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.WriteFile(clusterFile(h, "ca.pem"), caPEM, 0o600)
}

// CAFile is where h keeps its cluster CA certificate, or "" when h is in no cluster: what a
// client that takes a file (the NATS CLI's TLS CA) trusts h's bus by.
func CAFile(h home.Dir) string {
	if len(CAPEM(h)) == 0 {
		return ""
	}
	return clusterFile(h, "ca.pem")
}

// CAPEM is the cluster CA certificate of h, or nil when h is in no cluster.
func CAPEM(h home.Dir) []byte {
	b, _ := os.ReadFile(clusterFile(h, "ca.pem"))
	return b
}

// Fingerprint is the hex SHA-256 of the first certificate in a PEM block: what a join token
// pins the cluster CA by.
func Fingerprint(certPEM []byte) string {
	blk, _ := pem.Decode(certPEM)
	if blk == nil {
		return ""
	}
	sum := sha256.Sum256(blk.Bytes)
	return hex.EncodeToString(sum[:])
}

// caPool is the pool of h's cluster CA.
func caPool(h home.Dir) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(CAPEM(h)) {
		return nil, fmt.Errorf("cluster: no usable CA certificate at %s", clusterFile(h, "ca.pem"))
	}
	return pool, nil
}

// nodeTLS is the TLS configuration of h's bus node: its certificate, and its peers' (and, for
// routes, required) certificates checked against the cluster CA.
func nodeTLS(h home.Dir, requireClientCert bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(clusterFile(h, "node.pem"), clusterFile(h, "node-key.pem"))
	if err != nil {
		return nil, fmt.Errorf("cluster: this node's certificate: %w (rejoin with `nexus cluster join`)", err)
	}
	pool, err := caPool(h)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool, ClientCAs: pool}
	if requireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientTLS is what a client of h's bus needs to trust it: nil when h is in no cluster (its
// bus is on loopback without TLS).
func ClientTLS(h home.Dir) (*tls.Config, error) {
	if len(CAPEM(h)) == 0 {
		return nil, nil
	}
	pool, err := caPool(h)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}

// ControlUsers are the bus users only a control host's node has (Cluster.Control).
var ControlUsers = []string{UserAdmin, UserGateway, UserCredbroker}

// HostUsers are the bus users of h's node: every user on a single host or a control host, the
// control users left out on a worker host.
func HostUsers(h home.Dir) []string {
	cl, ok, _ := LoadCluster(h)
	if !ok || cl.Control {
		return Users
	}
	return slices.DeleteFunc(slices.Clone(Users), func(u string) bool { return slices.Contains(ControlUsers, u) })
}

// isLoopback reports whether host names only the loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// addHost appends host to hosts unless it is there.
func addHost(hosts []string, host string) []string {
	if slices.Contains(hosts, host) {
		return hosts
	}
	return append(hosts, host)
}

// randomSecret is 32 random bytes in hex.
func randomSecret() string {
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		panic(err)
	}
	return hex.EncodeToString(buf)
}

// validHostName is what a host name on the bus may be: one subject token.
func validHostName(s string) error {
	if s == "" || strings.ContainsAny(s, ". *>\t\n") || len(s) > 63 {
		return errdefs.Invalid("%q is not a host name (one word of at most 63 characters: no dots, spaces or wildcards)", s)
	}
	return nil
}

// ClusterInfo is what a node's membership shows: everything but the route password.
type ClusterInfo struct {
	Name      string `json:"name"`
	Host      string `json:"host"`
	Control   bool   `json:"control"`
	ClientURL string `json:"client_url"`
	RouteURL  string `json:"route_url"`
}

// Public is c without its secrets.
func (c Cluster) Public() ClusterInfo {
	return ClusterInfo{Name: c.Name, Host: c.Host, Control: c.Control, ClientURL: c.ClientURL(), RouteURL: c.RouteURL()}
}
