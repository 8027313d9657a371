// Package portfwd is the real-guest end-to-end test of port auto-forward: a whole nexus stack
// (one `nexus serve` process per service) boots nexus-mini sandboxes, servers run in the guest,
// and the host reaches them at the same port on 127.0.0.1.
package portfwd
