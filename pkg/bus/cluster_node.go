package bus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// ClusterJoinSubject is where the node holding the cluster CA answers joins.
const ClusterJoinSubject = "nexus.cluster.join"

// joinUserPrefix names the bus user of a join token: join-<token id>.
const joinUserPrefix = "join-"

// clusterOptions makes opts a node of cl: a unique server name, its client port beyond
// loopback with TLS, routes with mutual TLS against the cluster CA plus the route password.
func clusterOptions(h home.Dir, cl Cluster, opts *server.Options) error {
	listen := cl.Listen
	if listen == "" {
		listen = "0.0.0.0"
	}
	clientTLS, err := nodeTLS(h, false)
	if err != nil {
		return err
	}
	routeTLS, err := nodeTLS(h, true)
	if err != nil {
		return err
	}
	opts.ServerName = "nexus-" + cl.Host
	opts.Host, opts.Port = listen, cl.ClientPort
	opts.TLSConfig, opts.TLSTimeout, opts.TLSVerify = clientTLS, 5, false
	opts.Cluster = server.ClusterOpts{
		Name: cl.Name, Host: listen, Port: cl.RoutePort,
		Username: cl.RouteUser, Password: cl.RoutePassword,
		TLSConfig: routeTLS, TLSTimeout: 5,
		Advertise: net.JoinHostPort(cl.Advertise, strconv.Itoa(cl.RoutePort)),
	}
	for _, r := range cl.Routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" {
			return errdefs.Invalid("cluster: route %q in cluster.json is not a URL", r)
		}
		u.User = url.UserPassword(cl.RouteUser, cl.RoutePassword)
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}

// clusterLoop keeps a clustered node's JetStream in shape until Shutdown: it makes the buckets
// and streams once a quorum answers, raises them to ClusterReplicas once three nodes are in the
// cluster (never lowers them), and on the node with the CA answers joins.
func (s *Server) clusterLoop(ctx context.Context) {
	defer close(s.done)
	nc, err := Connect(ctx, ConnectConfig{Home: s.home, User: UserBus, URL: s.url, Log: s.log, Reconnect: true})
	if err != nil {
		s.log.Error().Err(err).Msg("cluster: the bus user cannot connect")
		return
	}
	defer nc.Close()
	if _, _, err := loadCA(s.home); err == nil {
		sub, err := nc.Subscribe(ClusterJoinSubject, func(m *nats.Msg) { s.answerJoin(m) })
		if err != nil {
			s.log.Error().Err(err).Msg("cluster: cannot answer joins")
		} else {
			defer sub.Unsubscribe()
		}
	}
	replicas := 0
	var migrateRetry time.Time
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 0; ; n++ {
		want := 1
		if len(s.ns.JetStreamClusterPeers()) >= ClusterReplicas {
			want = ClusterReplicas
		}
		// Only the meta leader sets the store up, so that two nodes counting the cluster at
		// different moments cannot undo each other's replica count.
		if !s.ns.JetStreamIsLeader() {
			replicas = 0
		} else if want > replicas {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := EnsureJetStream(cctx, nc, want)
			cancel()
			if err == nil {
				s.log.Info().Int("replicas", want).Msg("cluster: buckets and streams in place")
				replicas = want
			} else if n%10 == 0 {
				s.log.Warn().Err(err).Msg("cluster: JetStream not ready yet (it needs a quorum of the cluster's nodes: two of three)")
			}
		}
		// The node that ran `nexus cluster init` brings its single-host store along once the
		// store serves (WaitStore does it before the services under `nexus up`; here for a bus
		// run on its own, whose services wait for the marker it writes).
		if n%5 == 0 && MigrationPending(s.home) && time.Now().After(migrateRetry) {
			sctx, cancel := StoreContext(ctx)
			ready := StoreReady(sctx, nc) == nil
			cancel()
			if ready {
				if err := s.migrateSingleHost(ctx); err != nil {
					s.log.Error().Err(err).Msg("cluster: migration failed; trying again in 30s")
					migrateRetry = time.Now().Add(30 * time.Second)
				}
			}
		}
		if !s.next(ctx, tick) {
			return
		}
	}
}

// WaitStore returns once the bus's JetStream store serves every bucket and stream
// (StoreReady), for the services that open them as they start. A single-host bus has its store
// before StartServer returns. A cluster node has none until a quorum of the cluster's nodes is
// up and the meta leader has set it up, which may be long after this node started (its peers
// start when their operators start them, and the first node must answer their joins
// meanwhile); it says every ten seconds what it waits for, until ctx ends.
func (s *Server) WaitStore(ctx context.Context) error {
	if s.cluster == nil {
		return nil
	}
	nc, err := Connect(ctx, ConnectConfig{Home: s.home, User: UserBus, URL: s.url, Log: s.log, Reconnect: true})
	if err != nil {
		return err
	}
	defer nc.Close()
	err = waitStore(ctx, s.stop, s.log, func(ctx context.Context) error { return StoreReady(ctx, nc) },
		func(ev *zerolog.Event) *zerolog.Event { return ev.Int("nodes", len(s.ns.JetStreamClusterPeers())) })
	if errors.Is(err, errStopped) {
		return errors.New("bus: stopped while waiting for the cluster's store")
	}
	if err != nil {
		return err
	}
	// A store just elected may not answer every write at once: a few tries before giving up.
	for try := 1; ; try++ {
		err := s.migrateSingleHost(ctx)
		if err == nil || try == 3 || ctx.Err() != nil {
			return err
		}
		s.log.Warn().Err(err).Msg("cluster: migration failed; trying again in 5s")
		select {
		case <-s.stop:
			return errors.New("bus: stopped while migrating the single-host store")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// migrateSingleHost migrates, once the cluster's store serves, the single-host store that
// `nexus cluster init` set aside on this home (MigrationPending), before the services start:
// a gateway that found no record of a sandbox's snapshot would remove it. Only the first run
// copies anything; a run cut off is resumed by the next.
func (s *Server) migrateSingleHost(ctx context.Context) error {
	s.migrateMu.Lock()
	defer s.migrateMu.Unlock()
	if s.cluster == nil || !MigrationPending(s.home) {
		return nil
	}
	// Shutdown ends a migration under way; the next start resumes it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	from := SingleHostStore(s.home)
	nc, err := Connect(ctx, ConnectConfig{Home: s.home, User: UserAdmin, URL: s.url, Log: s.log})
	if err != nil {
		return fmt.Errorf("cluster: migrating %s: %w", from, err)
	}
	defer nc.Close()
	s.log.Info().Str("from", from).Msg("cluster: migrating the single-host store into the cluster's")
	st, err := Migrate(ctx, MigrateConfig{From: from, To: nc, Host: s.cluster.Host, Log: s.log})
	if errors.Is(err, errdefs.ErrConflict) {
		// `nexus cluster migrate` runs it: wait for its marker.
		return WaitMigrated(ctx, s.home, s.log)
	}
	if err != nil {
		return fmt.Errorf("cluster: migrating the single-host store %s: %w (the services wait for it; to start without it move that directory away, and copy it later with `nexus cluster migrate --from`)", from, err)
	}
	s.log.Info().Int("records", st.Records).Int("existing", st.Existing).Int("audit", st.Audit).Int("events", st.Events).
		Msg("cluster: " + st.String())
	return nil
}

// WaitStoreAs is WaitStore for one service of a cluster node run on its own (`nexus serve
// <service>`), on its own connection nc as user: it returns once every bucket and stream user
// may read serves (at once when it reads none, or on a single-host bus), saying every ten
// seconds what it waits for, until ctx ends.
func WaitStoreAs(ctx context.Context, nc *nats.Conn, user string, log zerolog.Logger) error {
	names := storeNamesOf(user)
	if len(names) == 0 {
		return nil
	}
	return waitStore(ctx, nil, log, func(ctx context.Context) error { return storeServes(ctx, nc, names) },
		func(ev *zerolog.Event) *zerolog.Event { return ev })
}

var errStopped = errors.New("stopped")

// waitStore probes the store every second until it serves, logging the quorum line every ten
// tries (with what detail adds); it ends with ctx, or errStopped when stop closes.
func waitStore(ctx context.Context, stop <-chan struct{}, log zerolog.Logger, probe func(context.Context) error, detail func(*zerolog.Event) *zerolog.Event) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	waitingSince := time.Now()
	for n := 0; ; n++ {
		sctx, cancel := StoreContext(ctx)
		err := probe(sctx)
		cancel()
		if err == nil {
			if n > 0 {
				log.Info().Dur("waited", time.Since(waitingSince).Round(time.Second)).Msg("cluster: the store serves; starting the services")
			}
			return nil
		}
		if n%10 == 0 {
			detail(log.Warn()).Msg("cluster: waiting for a quorum of the cluster's bus nodes (two of three) before starting the services")
		}
		select {
		case <-stop:
			return errStopped
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// next waits for tick; false once the server stops or ctx ends.
func (s *Server) next(ctx context.Context, tick *time.Ticker) bool {
	select {
	case <-s.stop:
		return false
	case <-ctx.Done():
		return false
	case <-tick.C:
		return true
	}
}

// joinMu serialises the CA host's writes of tokens.json (answerJoin and the CLI in-process).
var joinMu sync.Mutex

// Token is one join token as the CA host keeps it: the secret only as a bcrypt hash.
type Token struct {
	ID      string    `json:"id"`
	Hash    string    `json:"hash"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	Revoked bool      `json:"revoked,omitempty"`
	// Joined lists the hosts that joined with it.
	Joined []string `json:"joined,omitempty"`
}

// Usable reports whether t still lets a host join at now.
func (t Token) Usable(now time.Time) bool { return !t.Revoked && now.Before(t.Expires) }

func loadTokens(h home.Dir) ([]Token, error) {
	b, err := os.ReadFile(clusterFile(h, "tokens.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Token
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("cluster: %s is damaged", clusterFile(h, "tokens.json"))
	}
	return out, nil
}

func saveTokens(h home.Dir, ts []Token) error {
	b, _ := json.MarshalIndent(ts, "", "  ")
	return atomicfile.WriteFile(clusterFile(h, "tokens.json"), append(b, '\n'), 0o600)
}

// tokenWire is what a join token carries: where to join, which CA to expect, and the secret.
type tokenWire struct {
	URLs   []string `json:"u"`
	ID     string   `json:"i"`
	Secret string   `json:"s"`
	CA     string   `json:"ca"` // SHA-256 of the CA certificate
}

// TokenPrefix starts every join token, so that one pasted in the wrong place is recognisable.
const TokenPrefix = "nxjoin1."

// CreateToken makes a join token valid for ttl on the CA host h, whose bus clients on other
// hosts reach at urls. It returns the record and the token to hand to the joining host.
func CreateToken(h home.Dir, urls []string, ttl time.Duration) (Token, string, error) {
	if _, _, err := loadCA(h); err != nil {
		return Token{}, "", err
	}
	if ttl <= 0 || ttl > 7*24*time.Hour {
		return Token{}, "", errdefs.Invalid("a join token lives between 1s and 168h, not %s", ttl)
	}
	secret := randomSecret()
	// The secret is 256 random bits, beyond any guessing: bcrypt's cost buys nothing here and
	// each join and connection pays it, so the minimum.
	hash, err := bcrypt.GenerateFromPassword([]byte(secret), bcrypt.MinCost)
	if err != nil {
		return Token{}, "", err
	}
	now := time.Now().UTC()
	t := Token{ID: randomSecret()[:12], Hash: string(hash), Created: now, Expires: now.Add(ttl)}
	joinMu.Lock()
	defer joinMu.Unlock()
	ts, err := loadTokens(h)
	if err != nil {
		return Token{}, "", err
	}
	// Tokens long gone are dropped; a revoked or expired one stays a day for `ls`.
	ts = slices.DeleteFunc(ts, func(x Token) bool { return now.Sub(x.Expires) > 24*time.Hour })
	if err := saveTokens(h, append(ts, t)); err != nil {
		return Token{}, "", err
	}
	b, _ := json.Marshal(tokenWire{URLs: urls, ID: t.ID, Secret: secret, CA: Fingerprint(CAPEM(h))})
	return t, TokenPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// Tokens lists the CA host's join tokens.
func Tokens(h home.Dir) ([]Token, error) { return loadTokens(h) }

// RevokeToken revokes the token id: no host joins with it any more, and a join under way with
// it is cut off.
func RevokeToken(h home.Dir, id string) error {
	joinMu.Lock()
	defer joinMu.Unlock()
	ts, err := loadTokens(h)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(ts, func(t Token) bool { return t.ID == id })
	if i < 0 {
		return errdefs.NotFound("no join token %s (nexus cluster token ls)", id)
	}
	ts[i].Revoked = true
	return saveTokens(h, ts)
}

// JoinRequest is what a joining host sends: its token, its name, the addresses its node is
// reached at and the public key its certificate is for.
type JoinRequest struct {
	TokenID   string   `json:"token_id"`
	Secret    string   `json:"secret"`
	Host      string   `json:"host"`
	Advertise string   `json:"advertise"`
	PublicKey []byte   `json:"public_key"` // PKIX DER
	Addrs     []string `json:"addrs,omitempty"`
}

// JoinResponse is the joining host's membership: the CA, its certificate and where to route.
type JoinResponse struct {
	Error         string   `json:"error,omitempty"`
	Cluster       string   `json:"cluster"`
	CA            []byte   `json:"ca"`
	Cert          []byte   `json:"cert"`
	Routes        []string `json:"routes"`
	RouteUser     string   `json:"route_user"`
	RoutePassword string   `json:"route_password"`
}

// answerJoin admits a host with a usable token: it signs its certificate and hands it the
// cluster's route credentials. A token's secret is checked here again, not only by the bus.
func (s *Server) answerJoin(m *nats.Msg) {
	resp, err := s.admit(m.Data)
	if err != nil {
		resp = JoinResponse{Error: err.Error()}
		s.log.Warn().Err(err).Msg("cluster: join refused")
	}
	b, _ := json.Marshal(resp)
	m.Respond(b)
}

func (s *Server) admit(data []byte) (JoinResponse, error) {
	if len(data) > 64<<10 {
		return JoinResponse{}, errors.New("join request too large")
	}
	var req JoinRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return JoinResponse{}, errors.New("join request is not JSON")
	}
	if err := validHostName(req.Host); err != nil {
		return JoinResponse{}, err
	}
	if req.Advertise == "" {
		return JoinResponse{}, errors.New("the joining host names no address (--advertise)")
	}
	pub, err := x509.ParsePKIXPublicKey(req.PublicKey)
	if err != nil {
		return JoinResponse{}, errors.New("the joining host's public key is not PKIX")
	}
	joinMu.Lock()
	defer joinMu.Unlock()
	ts, err := loadTokens(s.home)
	if err != nil {
		return JoinResponse{}, err
	}
	i := slices.IndexFunc(ts, func(t Token) bool { return t.ID == req.TokenID })
	if i < 0 || bcrypt.CompareHashAndPassword([]byte(ts[i].Hash), []byte(req.Secret)) != nil {
		return JoinResponse{}, errors.New("the join token is not one of this cluster's")
	}
	if !ts[i].Usable(time.Now()) {
		return JoinResponse{}, fmt.Errorf("join token %s has expired or was revoked", req.TokenID)
	}
	joined := req.Host == s.cluster.Host || slices.Contains(s.ns.JetStreamClusterPeers(), "nexus-"+req.Host)
	for _, t := range ts {
		joined = joined || slices.Contains(t.Joined, req.Host)
	}
	if joined {
		return JoinResponse{}, fmt.Errorf("a host named %s is in the cluster already: join under another --host", req.Host)
	}
	cert, err := SignNode(s.home, req.Host, append([]string{req.Advertise}, req.Addrs...), pub)
	if err != nil {
		return JoinResponse{}, err
	}
	ts[i].Joined = addHost(ts[i].Joined, req.Host)
	if err := saveTokens(s.home, ts); err != nil {
		return JoinResponse{}, err
	}
	s.log.Info().Str("host", req.Host).Str("token", req.TokenID).Msg("cluster: host joined")
	return JoinResponse{Cluster: s.cluster.Name, CA: CAPEM(s.home), Cert: cert, Routes: []string{s.cluster.RouteURL()},
		RouteUser: s.cluster.RouteUser, RoutePassword: s.cluster.RoutePassword}, nil
}

// JoinConfig is how `nexus cluster join` joins this home to a cluster.
type JoinConfig struct {
	Home      home.Dir
	Token     string
	Host      string
	Advertise string
	Listen    string
	// ClientPort and RoutePort: 0 picks DefaultPort and DefaultRoutePort.
	ClientPort, RoutePort int
	// Control: this host runs a gateway and credbroker too (Cluster.Control).
	Control bool
}

// Join makes h a node of the cluster the token names: it reaches the CA host over TLS pinned
// to the token's CA, sends its public key and writes the membership it gets back. The bus of
// h must be stopped; its own JetStream store (single-host buckets) is moved aside, since the
// cluster's are the ones that count.
func Join(ctx context.Context, cfg JoinConfig) (Cluster, error) {
	if err := validHostName(cfg.Host); err != nil {
		return Cluster{}, err
	}
	if cfg.Advertise == "" {
		return Cluster{}, errdefs.Invalid("--advertise is required: the address the other hosts reach this one at")
	}
	if _, ok, _ := LoadCluster(cfg.Home); ok {
		return Cluster{}, errdefs.Conflict("this home is in a cluster already (%s)", clusterFile(cfg.Home, "cluster.json"))
	}
	if busRunning(cfg.Home) {
		return Cluster{}, errdefs.Conflict("the bus of %s is running: stop this host's stack before it joins (it restarts as a cluster node)", cfg.Home)
	}
	raw, ok := strings.CutPrefix(strings.TrimSpace(cfg.Token), TokenPrefix)
	var tw tokenWire
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if !ok || err != nil || json.Unmarshal(b, &tw) != nil || len(tw.URLs) == 0 || tw.CA == "" {
		return Cluster{}, errdefs.Invalid("that is not a nexus join token (they start with %s: `nexus cluster token create` on the first host)", TokenPrefix)
	}
	var caPEM []byte
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified below against the CA the token pins
		VerifyConnection: func(cs tls.ConnectionState) error {
			var ca *x509.Certificate
			for _, c := range cs.PeerCertificates {
				if Fingerprint(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})) == tw.CA {
					ca = c
				}
			}
			if ca == nil || len(cs.PeerCertificates) == 0 {
				return errors.New("the bus is not of the cluster the join token names (its CA differs)")
			}
			pool := x509.NewCertPool()
			pool.AddCert(ca)
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool}); err != nil {
				return fmt.Errorf("the bus's certificate does not chain to the token's CA: %v", err)
			}
			caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
			return nil
		},
	}
	user := joinUserPrefix + tw.ID
	nc, err := nats.Connect(strings.Join(tw.URLs, ","), nats.UserInfo(user, tw.Secret), nats.Secure(tlsCfg),
		nats.CustomInboxPrefix(InboxPrefix(user)), nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) {
			return Cluster{}, errdefs.Refused("the cluster at %s refused the join token: it expired, was revoked or is not one of its tokens", strings.Join(tw.URLs, ", "))
		}
		return Cluster{}, errdefs.Unavailable("cannot reach the cluster at %s: %v", strings.Join(tw.URLs, ", "), err)
	}
	defer nc.Close()
	key, err := NewNodeKey(cfg.Home)
	if err != nil {
		return Cluster{}, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	body, _ := json.Marshal(JoinRequest{TokenID: tw.ID, Secret: tw.Secret, Host: cfg.Host, Advertise: cfg.Advertise, PublicKey: pub})
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, ClusterJoinSubject, body)
	if err != nil {
		return Cluster{}, errdefs.Unavailable("the cluster did not answer the join: %v", err)
	}
	var resp JoinResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return Cluster{}, errdefs.Unavailable("the cluster's answer to the join is not JSON")
	}
	if resp.Error != "" {
		return Cluster{}, errdefs.Refused("the cluster refused the join: %s", resp.Error)
	}
	if Fingerprint(resp.CA) != tw.CA || !slices.Equal(resp.CA, caPEM) {
		return Cluster{}, errdefs.Refused("the cluster answered with another CA than the token's")
	}
	if err := WriteNodeCert(cfg.Home, append(resp.Cert, resp.CA...), resp.CA); err != nil {
		return Cluster{}, err
	}
	// The home's single-host store is not the cluster's: keep it aside, never delete it.
	if err := moveStoreAside(cfg.Home, "before-join"); err != nil {
		return Cluster{}, err
	}
	cl := Cluster{Name: resp.Cluster, Host: cfg.Host, Advertise: cfg.Advertise, Listen: cfg.Listen,
		ClientPort: orDefault(cfg.ClientPort, DefaultPort), RoutePort: orDefault(cfg.RoutePort, DefaultRoutePort),
		Routes: resp.Routes, RouteUser: resp.RouteUser, RoutePassword: resp.RoutePassword, Control: cfg.Control}
	return cl, SaveCluster(cfg.Home, cl)
}

// InitConfig is how `nexus cluster init` makes this home the first node of a cluster.
type InitConfig struct {
	Home      home.Dir
	Name      string
	Host      string
	Advertise string
	Listen    string
	// ClientPort and RoutePort: 0 picks DefaultPort and DefaultRoutePort.
	ClientPort, RoutePort int
}

// Init makes h the first node of a new cluster: the CA, this node's certificate and the route
// credentials. The home's single-host store is moved aside (SingleHostStore); its bus migrates
// it into the cluster's store once that serves (Server.WaitStore, Migrate).
func Init(cfg InitConfig) (Cluster, error) {
	if err := validHostName(cfg.Host); err != nil {
		return Cluster{}, err
	}
	if cfg.Host == LocalHost {
		return Cluster{}, errdefs.Invalid("a cluster host needs its own name (--host), not %q", LocalHost)
	}
	if cfg.Advertise == "" {
		return Cluster{}, errdefs.Invalid("--advertise is required: the address the other hosts reach this one at")
	}
	if cfg.Name == "" {
		cfg.Name = "nexus"
	}
	if _, ok, _ := LoadCluster(cfg.Home); ok {
		return Cluster{}, errdefs.Conflict("this home is in a cluster already (%s)", clusterFile(cfg.Home, "cluster.json"))
	}
	if busRunning(cfg.Home) {
		return Cluster{}, errdefs.Conflict("the bus of %s is running: stop this host's stack first (it restarts as a cluster node)", cfg.Home)
	}
	// JetStream does not turn a single server's store into a cluster's: the single-host store
	// is moved aside (SingleHostStore) and the cluster starts its own.
	if err := moveStoreAside(cfg.Home, singleHostSuffix); err != nil {
		return Cluster{}, err
	}
	if err := NewCA(cfg.Home, cfg.Name); err != nil {
		return Cluster{}, err
	}
	key, err := NewNodeKey(cfg.Home)
	if err != nil {
		return Cluster{}, err
	}
	cert, err := SignNode(cfg.Home, cfg.Host, []string{cfg.Advertise}, &key.PublicKey)
	if err != nil {
		return Cluster{}, err
	}
	if err := WriteNodeCert(cfg.Home, append(cert, CAPEM(cfg.Home)...), CAPEM(cfg.Home)); err != nil {
		return Cluster{}, err
	}
	cl := Cluster{Name: cfg.Name, Host: cfg.Host, Advertise: cfg.Advertise, Listen: cfg.Listen,
		ClientPort: orDefault(cfg.ClientPort, DefaultPort), RoutePort: orDefault(cfg.RoutePort, DefaultRoutePort),
		RouteUser: "route", RoutePassword: randomSecret(), Control: true}
	// JetStream's cluster mode wants a configured route: the node's own one (a route to itself
	// is recognised and dropped) until others join and gossip theirs.
	cl.Routes = []string{cl.RouteURL()}
	return cl, SaveCluster(cfg.Home, cl)
}

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// ClusterPeers are the bus nodes of the cluster as JetStream sees them (server names), this
// one included; nil on a single-host bus.
func (s *Server) ClusterPeers() []string {
	if s.cluster == nil {
		return nil
	}
	return s.ns.JetStreamClusterPeers()
}

// Replicas is the replica count of stream name as the bus reports it.
func Replicas(ctx context.Context, nc *nats.Conn, name string) (int, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	return st.CachedInfo().Config.Replicas, nil
}

// singleHostSuffix names the store `nexus cluster init` moved aside.
const singleHostSuffix = "single-host"

// SingleHostStore is where `nexus cluster init` left the home's single-host JetStream store.
func SingleHostStore(h home.Dir) string { return jetstreamDir(h) + "." + singleHostSuffix }

// moveStoreAside renames the home's JetStream store to <store>.<suffix> (with a time stamp if
// that exists already); nothing is deleted.
func moveStoreAside(h home.Dir, suffix string) error {
	js := jetstreamDir(h)
	if _, err := os.Stat(js); err != nil {
		return nil
	}
	to := js + "." + suffix
	if _, err := os.Stat(to); err == nil {
		to += "-" + time.Now().UTC().Format("20060102T150405")
	}
	if err := os.Rename(js, to); err != nil {
		return fmt.Errorf("cluster: moving the single-host store aside: %w", err)
	}
	return nil
}
