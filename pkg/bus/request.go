package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// DeadlineHeader carries the caller's deadline (unix milliseconds) so the handler's context
// ends when the caller stops waiting.
const DeadlineHeader = "Nexus-Deadline"

// DefaultTimeout bounds requests whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// Request sends req as JSON to subject and decodes the enveloped reply into Resp.
// Every request has a deadline: the context's, or DefaultTimeout. On a connection made with
// ConnectConfig.Watch, a request that waits also watches the service that took it
// (watchResponders) and ends at once, with a sentence saying so, when that service is gone.
func Request[Resp any](ctx context.Context, nc *nats.Conn, subject string, req any) (Resp, error) {
	return request[Resp](ctx, nc, subject, req, false)
}

// RequestAgain is Request for a call that may be sent twice (a read): when the service that
// took it restarted meanwhile, or the bus connection was re-established, it is sent again to
// whoever serves the subject now, within the same deadline.
func RequestAgain[Resp any](ctx context.Context, nc *nats.Conn, subject string, req any) (Resp, error) {
	return request[Resp](ctx, nc, subject, req, true)
}

func request[Resp any](ctx context.Context, nc *nats.Conn, subject string, req any, again bool) (Resp, error) {
	var out Resp
	err := requestInto(ctx, nc, subject, req, again, &out)
	return out, err
}

// requestInto is request decoding the reply into out, a pointer.
func requestInto(ctx context.Context, nc *nats.Conn, subject string, req any, again bool, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("%s: encode request: %w", subject, err)
	}
	for {
		reply, err := requestOnce(ctx, nc, subject, body, again)
		var gone errGone
		if again && errors.As(err, &gone) && (gone.replaced || gone.reconnected) && ctx.Err() == nil {
			continue // a read: asked again of the service that serves it now
		}
		if err != nil {
			return requestError(subject, err)
		}
		return Decode(reply.Data, out)
	}
}

// requestOnce sends one request and waits for its reply, watching its responder when nc asks
// for it.
func requestOnce(ctx context.Context, nc *nats.Conn, subject string, body []byte, again bool) (*nats.Msg, error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if name, ok := watched(nc, subject); ok {
		go watchResponders(wctx, nc, name, serviceOf(subject), again, func(g errGone) { cancel(g) })
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	dl, _ := ctx.Deadline()
	msg.Header.Set(DeadlineHeader, strconv.FormatInt(dl.UnixMilli(), 10))
	reply, err := nc.RequestMsgWithContext(wctx, msg)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		if cause := context.Cause(wctx); cause != nil {
			return nil, cause
		}
	}
	return reply, err
}

// requestError is the sentence for a request that got no reply.
func requestError(subject string, err error) error {
	var gone errGone
	switch {
	case errors.As(err, &gone), errors.Is(err, nats.ErrConnectionClosed):
		return lostReply(subject, err)
	case errors.Is(err, nats.ErrNoResponders):
		return errdefs.Unavailable("%s is not running (no responder on %s)", serviceOf(subject), subject)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return errdefs.Unavailable("%s did not answer in time (%s)", serviceOf(subject), subject)
	case errors.Is(err, nats.ErrPermissionViolation):
		return errdefs.Refused("not permitted to request %s", subject)
	}
	return fmt.Errorf("%s: %w", subject, err)
}

// serviceOf names the service behind a subject for error messages: nexus.vmm.local.create → vmm.
func serviceOf(subject string) string {
	start := len("nexus.")
	if len(subject) <= start {
		return subject
	}
	rest := subject[start:]
	for i := 0; i < len(rest); i++ {
		if rest[i] == '.' {
			return "the " + rest[:i] + " service"
		}
	}
	return rest
}
