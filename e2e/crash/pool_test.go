package crash_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// A cold boot is most of what a case costs under TCG, so the sandboxes a test leaves running
// and consistent (checkConsistent passed) are handed on: a later test that needs running
// sandboxes (created with createArgs) takes them instead of booting new ones, and one that
// needs stopped sandboxes takes those a crash during stop left stopped. What a test took and
// did not give back is removed when it ends.
//
// The pool's sandboxes wait paused: an idle guest under TCG still burns about a tenth of a
// host core (its timer ticks are emulated), which a dozen of them take from the boots being
// tested on a 2-core host. Waiting paused, they also go through every restart of the stack
// paused (adopted as they are), and take resumes them.
var (
	poolMu  sync.Mutex
	pool    []string // paused (or running, until give pauses them)
	stopped []string // stopped, with everything of their perimeter released
	poolSeq int
)

// poolCap is how many sandboxes are kept for later tests.
const poolCap = 6

// take returns n running sandboxes: from the pool (resumed), the rest created at once.
func take(t *testing.T, n int) []string {
	t.Helper()
	names := takeFrom(t, &pool, api.StatePaused, n, true)
	resume(t, names...)
	return names
}

// resume resumes those of names that are paused.
func resume(t *testing.T, names ...string) {
	t.Helper()
	if paused := inState(t, api.StatePaused, names...); len(paused) > 0 {
		stack.MustNexus(t, append([]string{"resume"}, paused...)...)
	}
}

// idle pauses those of names that are running, so that they wait without taking CPU from the
// boots under test.
func idle(t *testing.T, names ...string) {
	t.Helper()
	if running := inState(t, api.StateRunning, names...); len(running) > 0 {
		stack.MustNexus(t, append([]string{"pause"}, running...)...)
	}
}

// inState returns those of names whose sandbox is in state.
func inState(t *testing.T, state api.State, names ...string) []string {
	t.Helper()
	states := states(t)
	var in []string
	for _, name := range names {
		if states[name] == state {
			in = append(in, name)
		}
	}
	return in
}

// takeStopped returns n stopped sandboxes: those a crash during stop left, the rest taken
// running and stopped.
func takeStopped(t *testing.T, n int) []string {
	t.Helper()
	names := takeFrom(t, &stopped, api.StateStopped, n, false)
	if len(names) < n {
		names = append(names, take(t, n-len(names))...)
	}
	if stop := inState(t, api.StateRunning, names...); len(stop) > 0 {
		stack.MustNexus(t, append([]string{"stop"}, stop...)...)
	}
	return names
}

// takeFrom takes up to n sandboxes in state from from (a paused pool gives running ones too),
// creating the rest when create is set.
func takeFrom(t *testing.T, from *[]string, state api.State, n int, create bool) []string {
	t.Helper()
	states := states(t)
	poolMu.Lock()
	var names []string
	for len(names) < n && len(*from) > 0 {
		name := (*from)[0]
		*from = (*from)[1:]
		if states[name] == state || state == api.StatePaused && states[name] == api.StateRunning {
			names = append(names, name)
		}
	}
	var made []string
	for create && len(names)+len(made) < n {
		poolSeq++
		made = append(made, fmt.Sprintf("crash/pool-%d", poolSeq))
	}
	poolMu.Unlock()
	t.Cleanup(func() { // what was not handed on
		var left []string
		poolMu.Lock()
		for _, name := range append(names, made...) {
			if !slices.Contains(pool, name) && !slices.Contains(stopped, name) {
				left = append(left, name)
			}
		}
		poolMu.Unlock()
		if len(left) > 0 {
			stack.Nexus(t, append([]string{"rm", "--force"}, left...)...)
		}
	})
	if len(made) > 0 {
		createEach(t, made...)
	}
	return append(names, made...)
}

// give hands running sandboxes on, once t passed, paused; beyond poolCap they are removed.
func give(t *testing.T, names ...string) {
	t.Helper()
	if t.Failed() {
		return
	}
	poolMu.Lock()
	var keep, drop []string
	for _, name := range names {
		if len(pool) < poolCap {
			pool = append(pool, name)
			keep = append(keep, name)
		} else {
			drop = append(drop, name)
		}
	}
	poolMu.Unlock()
	if len(drop) > 0 {
		stack.MustNexus(t, append([]string{"rm", "--force"}, drop...)...)
		remember(t)
	}
	idle(t, keep...)
}

// giveStopped hands stopped sandboxes on, once t passed.
func giveStopped(t *testing.T, names ...string) {
	if t.Failed() {
		return
	}
	poolMu.Lock()
	stopped = append(stopped, names...)
	poolMu.Unlock()
}

// states is the state of every sandbox, by name.
func states(t *testing.T) map[string]api.State {
	t.Helper()
	m := map[string]api.State{}
	for _, s := range sandboxes(t) {
		m[s.Name] = s.State
	}
	return m
}
