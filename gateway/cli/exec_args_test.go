package cli

import (
	"slices"
	"testing"
)

// TestExecArgs: flags after NAME belong to the command (`nexus exec box ls -la`); a -- after
// NAME is allowed, and nexus flags between NAME and -- are still nexus's.
func TestExecArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		argv []string
		env  []string
	}{
		{[]string{"box", "ls", "-la"}, []string{"ls", "-la"}, nil},
		{[]string{"-e", "A=1", "box", "ls", "-e", "x"}, []string{"ls", "-e", "x"}, []string{"A=1"}},
		{[]string{"box", "--", "ls", "-la"}, []string{"ls", "-la"}, nil},
		{[]string{"box", "-e", "B=2", "--", "sh", "-c", "echo -- x"}, []string{"sh", "-c", "echo -- x"}, []string{"B=2"}},
		{[]string{"box", "echo", "--", "x"}, []string{"echo", "--", "x"}, nil},
	} {
		root := NewRoot()
		cmd, rest, err := root.Find(append([]string{"exec"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		args := cmd.Flags().Args()
		argv, err := execArgv(cmd, args[1:])
		env, _ := cmd.Flags().GetStringArray("env")
		if err != nil || !slices.Equal(argv, tc.argv) || !slices.Equal(env, tc.env) {
			t.Errorf("exec %v: argv %q env %q (%v), want %q %q", tc.args, argv, env, err, tc.argv, tc.env)
		}
	}
	root := NewRoot()
	root.SetArgs([]string{"exec", "box", "--"})
	if code := Execute(root); code != ExitExecFailed {
		t.Errorf("exec box --: exit %d, want %d", code, ExitExecFailed)
	}
}
