package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Limits bound what one sandbox writes to the audit stream through one publisher (one service),
// so that a guest flooding decisions cannot roll the other sandboxes' history out of the stream
// (docs/audit.md states the guarantee).
type Limits struct {
	// Rate is the events per second a sandbox may write, sustained; <= 0: no limit and no folding.
	Rate float64
	// Burst is how many events it may write at once above Rate.
	Burst int
	// Window: the first of identical decisions is written at once; the ones that follow within
	// Window are written as one event with Count, First and Last. A sandbox over its rate gets
	// one `suppressed` summary per Window (per decision) instead of its events.
	Window time.Duration
}

// DefaultLimits are the services' limits: well above what an agent's tools make (a package
// install is tens of requests a second) and a small fraction of what a flooding guest would write.
var DefaultLimits = Limits{Rate: 100, Burst: 1000, Window: time.Second}

// Unlimited writes every event as it is emitted.
var Unlimited = Limits{}

const (
	// maxFolded bounds the distinct decisions a sandbox has being folded at once; past it a new
	// one is written (rate-limited) without folding its repeats.
	maxFolded = 4096
	// idleState: a sandbox with nothing pending and a full bucket for this long is forgotten.
	idleState = time.Minute
	// Field bounds: an event is at most a few KiB whatever a guest sends.
	maxHostLen   = 255
	maxPathLen   = 512
	maxReasonLen = 256
	maxShortLen  = 64
)

// limiter applies Limits per sandbox. admit is called on the emitting goroutine; tick, every
// Window/4, writes the folded events and summaries that are due through out.
type limiter struct {
	l   Limits
	out func(ev Event, summary bool)

	mu        sync.Mutex
	sandboxes map[string]*sandboxLimit
}

type sandboxLimit struct {
	name        string
	tokens      float64
	refilled    time.Time
	active      time.Time
	folded      map[string]*foldEntry
	suppressed  [2]suppressCount // [0] denials, [1] the rest
	lastSummary time.Time
}

type foldEntry struct {
	ev          Event
	start       time.Time
	n           int64
	first, last time.Time
}

type suppressCount struct {
	n           int64
	first, last time.Time
}

func newLimiter(l Limits, out func(Event, bool)) *limiter {
	return &limiter{l: l, out: out, sandboxes: map[string]*sandboxLimit{}}
}

// clip bounds the free-text fields of an event.
func clip(ev *Event) {
	ev.Sandbox = clipString(ev.Sandbox, maxShortLen)
	ev.Host = clipString(ev.Host, maxHostLen)
	ev.Path = clipString(ev.Path, maxPathLen)
	ev.Reason = clipString(ev.Reason, maxReasonLen)
	ev.Method = clipString(ev.Method, maxShortLen)
	ev.Rule = clipString(ev.Rule, maxShortLen)
	ev.Layer = clipString(ev.Layer, maxShortLen)
	ev.Proto = clipString(ev.Proto, maxShortLen)
	ev.IP = clipString(ev.IP, maxShortLen)
	ev.Name = clipString(ev.Name, maxShortLen*2)
	ev.Token = clipString(ev.Token, maxShortLen)
}

// clipString bounds s to n bytes of valid UTF-8 without control characters (replaced by '?'),
// so that a field takes at most 2n bytes in the event's JSON (a quote or a backslash is two).
func clipString(s string, n int) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c >= 0x80 {
			clean = false
			break
		}
	}
	if !clean {
		s = strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError {
				return '?'
			}
			return r
		}, strings.ToValidUTF8(s, "?"))
	}
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// foldKey is what makes two decisions identical: everything but the time.
func foldKey(ev Event) string {
	ev.Time = time.Time{}
	b, _ := json.Marshal(ev)
	return string(b)
}

func (sl *sandboxLimit) take(l Limits, now time.Time) bool {
	sl.refill(l, now)
	if sl.tokens < 1 {
		return false
	}
	sl.tokens--
	return true
}

// takeFolded is take for a folded event, which stands for many: it may borrow the token that
// is refilling (never more than one), so that a flood of distinct events, which takes every
// token the moment it is whole, cannot turn every fold into a summary. What is written stays
// within the burst, the rate and one token more.
func (sl *sandboxLimit) takeFolded(l Limits, now time.Time) bool {
	sl.refill(l, now)
	if sl.tokens < 0 {
		return false
	}
	sl.tokens--
	return true
}

func (sl *sandboxLimit) refill(l Limits, now time.Time) {
	if el := now.Sub(sl.refilled); el > 0 {
		sl.tokens = min(float64(l.Burst), sl.tokens+el.Seconds()*l.Rate)
		sl.refilled = now
	}
}

func (sl *sandboxLimit) suppress(ev Event, n int64) {
	c := &sl.suppressed[1]
	if ev.Decision == Deny {
		c = &sl.suppressed[0]
	}
	first, last := ev.Time, ev.Time
	if ev.First != nil {
		first = *ev.First
	}
	if ev.Last != nil {
		last = *ev.Last
	}
	if c.n == 0 || first.Before(c.first) {
		c.first = first
	}
	if last.After(c.last) {
		c.last = last
	}
	c.n += n
}

// admit says whether ev is written now; if not, it is folded into an earlier identical one or
// counted in the sandbox's next `suppressed` summary.
func (lm *limiter) admit(ev Event, now time.Time) bool {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	sl := lm.sandboxes[ev.Sandbox]
	if sl == nil {
		sl = &sandboxLimit{tokens: float64(lm.l.Burst), refilled: now, folded: map[string]*foldEntry{}}
		lm.sandboxes[ev.Sandbox] = sl
	}
	sl.active = now
	if ev.Name != "" {
		sl.name = ev.Name
	}
	var key string
	if lm.l.Window > 0 {
		key = foldKey(ev)
		if e := sl.folded[key]; e != nil {
			if e.n == 0 {
				e.first = ev.Time
			}
			e.n++
			e.last = ev.Time
			return false
		}
	}
	if !sl.take(lm.l, now) {
		sl.suppress(ev, 1)
		return false
	}
	if key != "" && len(sl.folded) < maxFolded {
		sl.folded[key] = &foldEntry{ev: ev, start: now}
	}
	return true
}

// tick writes what is due at now: folded repeats whose window ended (one event each, within
// the rate) and one summary per decision for a sandbox that was over its rate. final writes
// everything pending (the publisher is closing).
func (lm *limiter) tick(now time.Time, final bool) {
	var out []Event
	var summaries []Event
	lm.mu.Lock()
	for id, sl := range lm.sandboxes {
		for key, e := range sl.folded {
			if !final && now.Sub(e.start) < lm.l.Window {
				continue
			}
			if e.n == 0 {
				delete(sl.folded, key)
				continue
			}
			ev := e.ev
			first, last := e.first, e.last
			ev.Time, ev.Count, ev.First, ev.Last = last, e.n, &first, &last
			if sl.takeFolded(lm.l, now) {
				out = append(out, ev)
			} else {
				sl.suppress(ev, e.n)
			}
			e.n, e.start = 0, now
			if final {
				delete(sl.folded, key)
			}
		}
		if final || now.Sub(sl.lastSummary) >= lm.l.Window {
			for i := range sl.suppressed {
				c := &sl.suppressed[i]
				if c.n == 0 {
					continue
				}
				decision := Allow
				if i == 0 {
					decision = Deny
				}
				first, last := c.first, c.last
				summaries = append(summaries, Event{
					Time: now, Sandbox: id, Name: sl.name, Layer: LayerAudit, Decision: decision, Rule: RuleSuppressed,
					Count: c.n, First: &first, Last: &last,
					Reason: fmt.Sprintf("%d %s decisions over the sandbox's audit limit of %g a second were not recorded one by one", c.n, decision, lm.l.Rate),
				})
				*c = suppressCount{}
				sl.lastSummary = now
			}
		}
		if len(sl.folded) == 0 && sl.suppressed == [2]suppressCount{} && now.Sub(sl.active) > idleState {
			delete(lm.sandboxes, id)
		}
	}
	lm.mu.Unlock()
	for _, ev := range out {
		lm.out(ev, false)
	}
	for _, ev := range summaries {
		lm.out(ev, true)
	}
}

// storeOverhead bounds what the stream stores per message beside the event: the subject
// (nexus.audit.<service>.<sandbox id>.suppressed), the message-id header, the record's framing.
const storeOverhead = 256

// MaxEventBytes is the largest event a publisher writes, every bounded field at its bound.
func MaxEventBytes() int {
	// Fields are clipped (clipString): a quote, two bytes in JSON, is the worst byte of them.
	long := func(n int) string { return strings.Repeat(`"`, n) + "…" }
	t := time.Now()
	ev := Event{Time: t, Sandbox: long(maxShortLen), Name: long(maxShortLen * 2), Layer: long(maxShortLen), Proto: long(maxShortLen),
		Host: long(maxHostLen), IP: long(maxShortLen), Port: 65535, Method: long(maxShortLen), Path: long(maxPathLen), Status: 599,
		Bytes: 1 << 62, Decision: Allow, Rule: long(maxShortLen), Reason: long(maxReasonLen), Swapped: true, Count: 1 << 62, First: &t, Last: &t}
	b, _ := marshal(ev)
	return len(b)
}

// marshal encodes an event as the publisher writes it (without HTML escaping, which would make
// a '<' six bytes).
func marshal(ev Event) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(ev); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// FloodBound is the most bytes a second one sandbox can make one service write to the audit
// stream once its burst is spent, whatever it does: its rate of events plus one summary per
// decision per window, each at most MaxEventBytes.
func FloodBound(l Limits) float64 {
	if l.Rate <= 0 {
		return 0 // unbounded
	}
	perSec := l.Rate + 2/l.Window.Seconds()
	return perSec * float64(MaxEventBytes()+storeOverhead)
}
