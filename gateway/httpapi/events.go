package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// sse writes Server-Sent Events: one JSON object per event, a comment as a keep-alive.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func newSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	s := &sse{w: w, f: f}
	s.flush()
	return s
}

func (s *sse) flush() {
	if s.f != nil {
		s.f.Flush()
	}
}

func (s *sse) event(name, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if id != "" {
		fmt.Fprintf(s.w, "id: %s\n", id)
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b); err != nil {
		return err
	}
	s.flush()
	return nil
}

func (s *sse) keepAlive() error {
	_, err := fmt.Fprint(s.w, ": keep-alive\n\n")
	s.flush()
	return err
}

const sseKeepAlive = 15 * time.Second

// sandboxLogs answers one chunk of the log as JSON ({data, next_offset}, data base64 as on the
// bus), or with follow=true every new chunk as a "log" event whose id is its next_offset (a
// client reconnecting with Last-Event-ID resumes there).
func sandboxLogs(s *Service, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := api.LogsRequest{Name: r.PathValue("name")}
	var err error
	if req.Agent, err = boolQuery(r, "agent", false); err != nil {
		return err
	}
	follow, err := boolQuery(r, "follow", false)
	if err != nil {
		return err
	}
	off := q.Get("offset")
	if last := r.Header.Get("Last-Event-ID"); last != "" && follow {
		off = last
	}
	if off != "" {
		if req.Offset, err = strconv.ParseInt(off, 10, 64); err != nil || req.Offset < 0 {
			return errdefs.Invalid("invalid offset %q", clip(off))
		}
	}
	if !follow {
		return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.LogsResponse, error) {
			return c.Logs(ctx, req)
		})
	}
	c, err := s.client(r.Context())
	if err != nil {
		return err
	}
	first, err := logsChunk(r.Context(), c, req)
	if err != nil {
		return err // before the stream starts: a status
	}
	ev := newSSE(w)
	wait, idle := 100*time.Millisecond, time.Duration(0)
	resp := first
	for {
		if len(resp.Data) > 0 {
			if ev.event("log", strconv.FormatInt(resp.NextOffset, 10), resp) != nil {
				return nil
			}
			wait, idle = 100*time.Millisecond, 0
		} else {
			select {
			case <-r.Context().Done():
				return nil
			case <-time.After(wait):
			}
			idle += wait
			wait = min(2*wait, time.Second)
			if idle >= sseKeepAlive {
				if ev.keepAlive() != nil {
					return nil
				}
				idle = 0
			}
		}
		req.Offset = resp.NextOffset
		if resp, err = logsChunk(r.Context(), c, req); err != nil {
			ev.event("error", "", errorBody(err))
			return nil
		}
	}
}

func logsChunk(ctx context.Context, c *api.Client, req api.LogsRequest) (api.LogsResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return c.Logs(ctx, req)
}

func errorBody(err error) ErrorBody {
	var b ErrorBody
	b.Error.Code, b.Error.Message = errdefs.Code(err), oneLine(err.Error())
	return b
}

// auditEvents streams the egress audit as "audit" events (audit.Event JSON): what is stored,
// then with follow (the default) what arrives. Filters: sandbox (names, repeatable), denied,
// since (a duration back from now). With api, the API's own request events instead (who
// called it with which token): admin only, since they name every token; token narrows them.
func auditEvents(s *Service, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var opts audit.TailOptions
	var err error
	if opts.API, err = boolQuery(r, "api", false); err != nil {
		return err
	}
	if opts.Tokens = q["token"]; len(opts.Tokens) > 0 {
		opts.API = true
	}
	if opts.API {
		if err := need(r, ScopeAdmin, "reading the API's request events"); err != nil {
			return err
		}
		if len(q["sandbox"]) > 0 {
			return errdefs.Invalid("sandbox selects egress decisions; API requests are selected with token")
		}
	}
	if opts.Denied, err = boolQuery(r, "denied", false); err != nil {
		return err
	}
	if opts.Follow, err = boolQuery(r, "follow", true); err != nil {
		return err
	}
	if v := q.Get("since"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errdefs.Invalid("invalid since %q: use a duration like 15m or 24h", clip(v))
		}
		opts.Since = time.Now().Add(-d)
	}
	c, err := s.client(r.Context())
	if err != nil {
		return err
	}
	for _, n := range q["sandbox"] {
		ctx, cancel := withTimeout(r, callTimeout)
		sb, err := c.Get(ctx, n)
		cancel()
		if err != nil {
			return err
		}
		opts.Sandboxes = append(opts.Sandboxes, sb.ID)
	}
	ev := newSSE(w)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	events := make(chan audit.Event, 64)
	errc := make(chan error, 1)
	go func() {
		defer close(events)
		errc <- audit.Tail(ctx, c.Conn(), opts, func(e audit.Event) error {
			select {
			case events <- e:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	tick := time.NewTicker(sseKeepAlive)
	defer tick.Stop()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				if err := <-errc; err != nil && ctx.Err() == nil {
					ev.event("error", "", errorBody(err))
				}
				return nil
			}
			if ev.event("audit", "", e) != nil {
				return nil
			}
		case <-tick.C:
			if ev.keepAlive() != nil {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}
