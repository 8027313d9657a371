package bus

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// StoreTimeout bounds one KV or stream operation. JetStream answers in milliseconds; one that
// cannot write (its disk is full) must fail in seconds with the cause, not hold a request for
// its whole handler deadline.
const StoreTimeout = 5 * time.Second

// StoreContext is ctx bounded by StoreTimeout.
func StoreContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, StoreTimeout)
}

// minFreeBytes is the free space below which a failed write is put down to a full disk.
const minFreeBytes = 1 << 20

// StoreError turns the error of a KV or stream operation into a sentence naming its cause:
// a full disk under home (the bus keeps its store there), or a bus that did not answer in
// time. Other errors come back as they are.
func StoreError(err error, home string) error {
	if err == nil {
		return nil
	}
	var st syscall.Statfs_t
	full := strings.Contains(err.Error(), "no space left") || strings.Contains(err.Error(), "insufficient")
	if !full && home != "" && syscall.Statfs(home, &st) == nil && st.Bavail*uint64(st.Bsize) < minFreeBytes {
		full = true
	}
	if full {
		return errdefs.Unavailable("the bus cannot write: no space left on %s", home)
	}
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoStreamResponse):
		return errdefs.Unavailable("the bus did not answer within %s (is it overloaded, or its disk failing?)", StoreTimeout)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.As(err, &apiErr) && apiErr.Code == 503:
		return errdefs.Unavailable("the bus cannot store anything now (JetStream is unavailable): %v", err)
	}
	return err
}
