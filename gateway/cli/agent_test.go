package cli

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

func TestLaunchArgv(t *testing.T) {
	claude := profile.Default()
	codex, err := profile.Get("codex")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		prof profile.Profile
		argv []string
		want []string
		err  string // substring of the one-line refusal
	}{
		{"claude gets auto mode", claude, []string{"/usr/local/bin/claude"}, []string{"/usr/local/bin/claude", "--permission-mode", "auto"}, ""},
		{"before its own args", claude, []string{"/usr/local/bin/claude", "--version"}, []string{"/usr/local/bin/claude", "--permission-mode", "auto", "--version"}, ""},
		{"claude elsewhere", claude, []string{"/opt/bin/claude", "-p", "hi"}, []string{"/opt/bin/claude", "--permission-mode", "auto", "-p", "hi"}, ""},
		{"already auto", claude, []string{"/usr/local/bin/claude", "--permission-mode", "auto"}, []string{"/usr/local/bin/claude", "--permission-mode", "auto"}, ""},
		{"already auto with =", claude, []string{"/usr/local/bin/claude", "--permission-mode=auto", "-p", "x"}, []string{"/usr/local/bin/claude", "--permission-mode=auto", "-p", "x"}, ""},
		{"after -- is an argument", claude, []string{"/usr/local/bin/claude", "--", "--permission-mode"}, []string{"/usr/local/bin/claude", "--permission-mode", "auto", "--", "--permission-mode"}, ""},
		{"not claude", claude, []string{"/bin/sh", "-c", "exit 7"}, []string{"/bin/sh", "-c", "exit 7"}, ""},
		{"codex has no flags to add", codex, []string{"/usr/local/bin/codex"}, []string{"/usr/local/bin/codex"}, ""},
		{"relative command", claude, []string{"claude"}, nil, "COMMAND must be an absolute path"},
		{"dot-relative command", claude, []string{"./claude"}, nil, "COMMAND must be an absolute path"},
		{"skip permissions", claude, []string{"/usr/local/bin/claude", "--dangerously-skip-permissions"}, nil, "--dangerously-skip-permissions is refused"},
		{"skip permissions anywhere", claude, []string{"/bin/sh", "-c", "true", "--dangerously-skip-permissions"}, nil, "--dangerously-skip-permissions is refused"},
		{"skip permissions for any agent", codex, []string{"/usr/local/bin/codex", "--dangerously-skip-permissions=true"}, nil, "is refused"},
		{"allow skip permissions", claude, []string{"/usr/local/bin/claude", "--allow-dangerously-skip-permissions"}, nil, "is refused"},
		{"bypass mode", claude, []string{"/usr/local/bin/claude", "--permission-mode", "bypassPermissions"}, nil, "bypassPermissions is refused"},
		{"bypass mode with =", claude, []string{"/usr/local/bin/claude", "--permission-mode=bypassPermissions"}, nil, "bypassPermissions is refused"},
		{"another mode", claude, []string{"/usr/local/bin/claude", "--permission-mode", "plan"}, nil, "--permission-mode plan is refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LaunchArgv(tc.prof, tc.argv)
			if tc.err != "" {
				if err == nil || !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("LaunchArgv(%q) = %q, %v; want one-line invalid error containing %q", tc.argv, got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("LaunchArgv(%q) = %q, %v; want %q", tc.argv, got, err, tc.want)
			}
			for _, a := range got {
				if strings.Contains(a, "dangerously") || strings.Contains(a, "bypassPermissions") {
					t.Fatalf("argv %q carries %q", got, a)
				}
			}
		})
	}
}

func TestLaunchName(t *testing.T) {
	a, b := launchName(), launchName()
	if a == b || !strings.HasPrefix(a, "launch/") || len(a) != len("launch/")+10 {
		t.Fatalf("names %q %q", a, b)
	}
}
