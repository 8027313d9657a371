package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// ServiceInfo identifies a service instance in `$SRV` discovery (nexus status, nats micro ls).
type ServiceInfo struct {
	Name        string // gateway, vmm, … (registered as nexus-<name>)
	Version     string
	Host        string
	Description string
}

// Metadata keys of every nexus service.
const (
	MetaHost    = "host"
	MetaStarted = "started"
	MetaPID     = "pid"
)

// ServiceName is the micro service name of a nexus service.
func ServiceName(name string) string { return ServicePrefix + name }

// Service is a micro service whose endpoints decode JSON requests, run typed handlers
// concurrently under the caller's deadline, and reply with the envelope.
type Service struct {
	nc   *nats.Conn
	svc  micro.Service
	log  zerolog.Logger
	sem  chan struct{}
	info ServiceInfo
}

// MaxHandlerTime bounds any one handler, whatever deadline the caller sent.
const MaxHandlerTime = 15 * time.Minute

// NewService registers the service with micro so it appears in `$SRV.PING|INFO|STATS`.
func NewService(nc *nats.Conn, info ServiceInfo, log zerolog.Logger) (*Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName(info.Name),
		Version:     info.Version,
		Description: info.Description,
		Metadata: map[string]string{
			MetaHost:    info.Host,
			MetaStarted: time.Now().UTC().Format(time.RFC3339Nano),
			MetaPID:     strconv.Itoa(pid()),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", info.Name, err)
	}
	return &Service{nc: nc, svc: svc, log: log, sem: make(chan struct{}, 256), info: info}, nil
}

// Stop deregisters the endpoints.
func (s *Service) Stop() error { return s.svc.Stop() }

// handle adds an endpoint on subject whose handler receives a decoded Req and returns a Resp
// or a classified error. Handlers run in their own goroutine so a slow create does not hold up
// a ps; at most 256 run at once per service.
func handle[Req, Resp any](s *Service, name, subject string, fn func(ctx context.Context, req Req) (Resp, error)) error {
	h := micro.HandlerFunc(func(r micro.Request) {
		deadline := time.Now().Add(DefaultTimeout)
		if v := r.Headers().Get(DeadlineHeader); v != "" {
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
				deadline = time.UnixMilli(ms)
			}
		}
		if max := time.Now().Add(MaxHandlerTime); deadline.After(max) {
			deadline = max
		}
		data := r.Data()
		s.sem <- struct{}{}
		go func() {
			defer func() { <-s.sem }()
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			resp, err := call(ctx, s.log, subject, data, fn)
			if err != nil && errdefs.Code(err) == errdefs.CodeInternal && errors.Is(err, context.DeadlineExceeded) {
				err = errdefs.Unavailable("%s: the request's deadline passed before it finished", subject)
			}
			var out []byte
			if err == nil {
				out, err = EncodeOK(resp)
			}
			if err != nil {
				if errdefs.Code(err) == errdefs.CodeInternal {
					s.log.Error().Err(err).Str("subject", subject).Msg("request failed")
				}
				out = EncodeError(err)
			}
			if rerr := r.Respond(out); rerr != nil {
				s.log.Warn().Err(rerr).Str("subject", subject).Msg("reply not delivered")
			}
		}()
	})
	if err := s.svc.AddEndpoint(name, h, micro.WithEndpointSubject(subject)); err != nil {
		return err
	}
	// Once registered, the endpoint answers: the subscription has reached the server.
	return s.nc.Flush()
}

func call[Req, Resp any](ctx context.Context, log zerolog.Logger, subject string, data []byte, fn func(context.Context, Req) (Resp, error)) (resp Resp, err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Error().Str("subject", subject).Str("panic", fmt.Sprint(p)).Bytes("stack", debug.Stack()).Msg("handler panicked")
			err = errdefs.New(errdefs.ErrInternal, fmt.Sprintf("internal error handling %s", subject))
		}
	}()
	var req Req
	if len(data) > 0 {
		if err := json.Unmarshal(data, &req); err != nil {
			return resp, errdefs.Invalid("bad request on %s: %v", subject, err)
		}
	}
	return fn(ctx, req)
}
