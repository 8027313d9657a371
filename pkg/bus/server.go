package bus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// DefaultPort is where the bus listens unless told otherwise. It is not NATS's 4222 so that a
// nexus bus and an operator's own NATS server can share a machine.
const DefaultPort = 4244

// ServerConfig configures the embedded bus.
type ServerConfig struct {
	Home home.Dir
	Host string // default 127.0.0.1; beyond loopback only as a cluster node (TLS, cluster.json)
	Port int    // 0 picks DefaultPort; -1 picks a random free port (tests)
	// HostName is this machine's name on the bus (--host): its services' users may serve and
	// request only its own host's subjects. Empty: LocalHost, or the cluster's name for it.
	HostName string
	Log      zerolog.Logger
}

// Server is the embedded nats-server with JetStream and per-service users.
type Server struct {
	ns      *server.Server
	lock    *os.File
	url     string
	home    home.Dir
	host    string
	cluster *Cluster // nil: the single-host bus
	log     zerolog.Logger
	stop    chan struct{}
	done    chan struct{}
	// migrateMu serialises the migration of the single-host store (migrateSingleHost).
	migrateMu sync.Mutex
}

// ErrAlreadyRunning is returned when another process already runs the bus for this home.
var ErrAlreadyRunning = errors.New("bus already running")

// StartServer starts the bus: credentials, JetStream store under $NEXUS_HOME/bus, streams and
// buckets. It holds an exclusive lock so a second bus for the same home refuses to start.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	cl, clustered, err := LoadCluster(cfg.Home)
	if err != nil {
		return nil, errdefs.Invalid("bus: %v", err)
	}
	if !clustered && !isLoopback(cfg.Host) {
		return nil, errdefs.Refused("bus: will not listen on %s: beyond 127.0.0.1 the bus requires TLS and its cluster's users (`nexus cluster init` or `nexus cluster join` first)", cfg.Host)
	}
	hostName := cfg.HostName
	if clustered {
		if hostName != "" && hostName != LocalHost && hostName != cl.Host {
			return nil, errdefs.Invalid("bus: this home is host %s of cluster %s, not %s: run it with --host %s (or NEXUS_HOST=%s)", cl.Host, cl.Name, hostName, cl.Host, cl.Host)
		}
		hostName = cl.Host
	}
	if hostName == "" {
		hostName = LocalHost
	}
	port := cfg.Port
	switch port {
	case 0:
		port = DefaultPort
	case -1:
		port = server.RANDOM_PORT
	}
	if err := cfg.Home.Ensure(); err != nil {
		return nil, errdefs.Invalid("%s", err.Error())
	}
	if err := os.MkdirAll(cfg.Home.Bus(), 0o700); err != nil {
		return nil, errdefs.Invalid("bus: %v", err)
	}
	lock, err := lockFile(filepath.Join(cfg.Home.Bus(), "bus.lock"))
	if err != nil {
		url, _ := ReadURL(cfg.Home, cfg.Port)
		return nil, errdefs.New(ErrAlreadyRunning, fmt.Sprintf("nexus: a bus is already running for %s at %s", cfg.Home, url))
	}
	creds, err := ensureCreds(cfg.Home.BusCreds())
	if err != nil {
		lock.Close()
		return nil, err
	}
	opts := &server.Options{
		ServerName: "nexus",
		Host:       cfg.Host,
		Port:       port,
		JetStream:  true,
		StoreDir:   jetstreamDir(cfg.Home),
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 8 << 20,
		// JetStream's own limits: the audit stream is bounded by age and bytes (jetstream.go).
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  8 << 30,
	}
	for _, u := range HostUsers(cfg.Home) {
		opts.Users = append(opts.Users, &server.User{Username: u, Password: creds[u].Password, Permissions: permissions(u, hostName)})
	}
	if clustered {
		if err := clusterOptions(cfg.Home, cl, opts); err != nil {
			lock.Close()
			return nil, err
		}
		port = cl.ClientPort
		cfg.Host = opts.Host
		// Beyond loopback the clients are checked by clusterAuth, which also admits the join
		// tokens' users as the tokens change.
		opts.CustomClientAuthentication = newClusterAuth(cfg.Home, opts.Users)
		opts.Users = nil
	}
	if port != server.RANDOM_PORT {
		// Say clearly that the port is taken rather than letting nats-server log and exit.
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(port)))
		if err != nil {
			lock.Close()
			return nil, errdefs.Unavailable("bus: cannot listen on %s:%d: the port is in use (choose another with --bus-port or NEXUS_BUS_PORT)", cfg.Host, port)
		}
		ln.Close()
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("bus: %w", err)
	}
	var storeFailed atomic.Bool
	ns.SetLoggerV2(storeLog{log: cfg.Log, failed: &storeFailed}, false, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		lock.Close()
		return nil, errdefs.Unavailable("bus: the server did not become ready on %s:%d", cfg.Host, port)
	}
	s := &Server{ns: ns, lock: lock, url: ns.ClientURL(), home: cfg.Home, host: hostName, log: cfg.Log, stop: make(chan struct{}), done: make(chan struct{})}
	if clustered {
		s.cluster = &cl
		s.url = "tls://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ns.Addr().(*net.TCPAddr).Port))
	}
	if err := atomicfile.WriteFile(urlPath(cfg.Home), []byte(s.url+"\n"), 0o600); err != nil {
		s.Shutdown()
		return nil, fmt.Errorf("bus: %w", err)
	}
	nc, err := Connect(ctx, ConnectConfig{Home: cfg.Home, User: UserBus, URL: s.url})
	if err != nil {
		s.Shutdown()
		return nil, err
	}
	if clustered {
		// A node of a cluster waits for its peers' quorum before JetStream answers; its buckets
		// and streams exist already once any node has made them. It keeps them at the replica
		// count the cluster's size asks for (replicasLoop), and serves joins when it has the CA.
		nc.Close()
		go s.clusterLoop(ctx)
		return s, nil
	}
	defer nc.Close()
	go func() { defer close(s.done); s.guardStore(&storeFailed, jetStreamConfig(opts)) }()
	// After an unclean stop JetStream recovers its store first; on a loaded machine that can
	// outlast one API timeout, so keep asking for a while before giving up.
	deadline := time.Now().Add(time.Minute)
	for {
		err := EnsureJetStream(ctx, nc, 1)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.Shutdown()
			return nil, err
		}
		cfg.Log.Warn().Err(err).Msg("jetstream not ready yet; retrying")
		time.Sleep(500 * time.Millisecond)
	}
	return s, nil
}

// URL is the client URL of the running bus.
func (s *Server) URL() string { return s.url }

// Shutdown stops the server, flushing JetStream, and releases the lock.
func (s *Server) Shutdown() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	os.Remove(urlPath(s.home))
	s.lock.Close()
}

func urlPath(h home.Dir) string { return filepath.Join(h.Bus(), "url") }

// ReadURL returns the URL the running bus wrote, or the loopback URL of port (0: DefaultPort)
// when it wrote none.
func ReadURL(h home.Dir, port int) (string, error) {
	if port <= 0 {
		port = DefaultPort
	}
	b, err := os.ReadFile(urlPath(h))
	if err == nil && busRunning(h) {
		if u := strings.TrimSpace(string(b)); u != "" {
			return u, nil
		}
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port), err
}

// busRunning reports whether a bus holds the lock of h: the URL a bus killed before it could
// remove it is stale and names a port another stack may own by now.
func busRunning(h home.Dir) bool {
	f, err := os.Open(filepath.Join(h.Bus(), "bus.lock"))
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil {
		return true // held exclusively: a bus runs
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	// A client checking for a running bus (busRunning) holds the lock shared for an instant.
	for try := 0; ; try++ {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || try == 20 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return f, nil
}
