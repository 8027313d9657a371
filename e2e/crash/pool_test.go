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
var (
	poolMu  sync.Mutex
	pool    []string // running
	stopped []string // stopped, with everything of their perimeter released
	poolSeq int
)

// poolCap is how many running sandboxes are kept for later tests (each running sandbox costs
// every checkConsistent an exec).
const poolCap = 4

// take returns n running sandboxes: from the pool, the rest created at once.
func take(t *testing.T, n int) []string {
	t.Helper()
	return takeFrom(t, &pool, api.StateRunning, n)
}

// takeStopped returns n stopped sandboxes: those a crash during stop left, the rest taken
// running and stopped.
func takeStopped(t *testing.T, n int) []string {
	t.Helper()
	names := takeFrom(t, &stopped, api.StateStopped, n)
	states := states(t)
	var stop []string
	for _, name := range names {
		if states[name] != api.StateStopped {
			stop = append(stop, name)
		}
	}
	if len(stop) > 0 {
		stack.MustNexus(t, append([]string{"stop"}, stop...)...)
	}
	return names
}

func takeFrom(t *testing.T, from *[]string, state api.State, n int) []string {
	t.Helper()
	states := states(t)
	poolMu.Lock()
	var names []string
	for len(names) < n && len(*from) > 0 {
		name := (*from)[0]
		*from = (*from)[1:]
		if states[name] == state {
			names = append(names, name)
		}
	}
	var create []string
	for len(names)+len(create) < n {
		poolSeq++
		create = append(create, fmt.Sprintf("crash/pool-%d", poolSeq))
	}
	poolMu.Unlock()
	t.Cleanup(func() { // what was not handed on
		var left []string
		poolMu.Lock()
		for _, name := range append(names, create...) {
			if !slices.Contains(pool, name) && !slices.Contains(stopped, name) {
				left = append(left, name)
			}
		}
		poolMu.Unlock()
		if len(left) > 0 {
			stack.Nexus(t, append([]string{"rm", "--force"}, left...)...)
		}
	})
	if len(create) > 0 {
		createEach(t, create...)
	}
	return append(names, create...)
}

// give hands running sandboxes on, once t passed; beyond poolCap they are removed.
func give(t *testing.T, names ...string) {
	t.Helper()
	if t.Failed() {
		return
	}
	poolMu.Lock()
	var drop []string
	for _, name := range names {
		if len(pool) < poolCap {
			pool = append(pool, name)
		} else {
			drop = append(drop, name)
		}
	}
	poolMu.Unlock()
	if len(drop) > 0 {
		stack.MustNexus(t, append([]string{"rm", "--force"}, drop...)...)
		remember(t)
	}
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
