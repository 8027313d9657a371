package cli

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/internal/testutil"
)

// TestSecretSetPrompts: on a terminal, secret set prompts for the value and does not echo it.
func TestSecretSetPrompts(t *testing.T) {
	home := testutil.IsolateHome(t)
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	root := NewRoot()
	var errOut bytes.Buffer
	root.SetIn(tty)
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&errOut)
	root.SetArgs([]string{"--home", home, "secret", "set", "TOKEN"})
	done := make(chan int, 1)
	go func() { done <- Execute(root) }()
	// Type the value once the terminal no longer echoes.
	testutil.WaitFor(t, 10*time.Second, func() error {
		st, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
		if err != nil || st.Lflag&unix.ECHO != 0 {
			return errors.New("the terminal still echoes")
		}
		return nil
	})
	ptmx.Write([]byte("s3cret-value\n"))
	<-done // the value is read; storing it fails here, with no bus
	tty.Write([]byte("END\n"))
	var seen strings.Builder
	sc := bufio.NewScanner(ptmx)
	for sc.Scan() && !strings.Contains(sc.Text(), "END") {
		seen.WriteString(sc.Text())
	}
	if strings.Contains(seen.String(), "s3cret") || strings.Contains(errOut.String(), "s3cret") {
		t.Errorf("the value was echoed: terminal %q, stderr %q", seen.String(), errOut.String())
	}
	if !strings.Contains(errOut.String(), "Value of secret TOKEN (not echoed): ") {
		t.Errorf("no prompt: %q", errOut.String())
	}
}
