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
// Every request has a deadline: the context's, or DefaultTimeout.
func Request[Resp any](ctx context.Context, nc *nats.Conn, subject string, req any) (Resp, error) {
	var out Resp
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	body, err := json.Marshal(req)
	if err != nil {
		return out, fmt.Errorf("%s: encode request: %w", subject, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	dl, _ := ctx.Deadline()
	msg.Header.Set(DeadlineHeader, strconv.FormatInt(dl.UnixMilli(), 10))
	reply, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return out, errdefs.Unavailable("%s is not running (no responder on %s)", serviceOf(subject), subject)
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
			return out, errdefs.Unavailable("%s did not answer in time (%s)", serviceOf(subject), subject)
		case errors.Is(err, nats.ErrPermissionViolation):
			return out, errdefs.Refused("not permitted to request %s", subject)
		}
		return out, fmt.Errorf("%s: %w", subject, err)
	}
	if err := Decode(reply.Data, &out); err != nil {
		return out, err
	}
	return out, nil
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
