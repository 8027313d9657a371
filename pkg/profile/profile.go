// Package profile is the declarative registry of agent profiles (DESIGN §3, seed "Choosing an
// agent").
//
// A profile decides how a sandbox's agent gets its credentials (a live-mounted credential
// directory or brokered placeholders), the entire egress allowlist, how the agent is told to trust
// the MITM CA, extra guest environment and the launch command. Adding an agent is adding one
// Profile value to registry; no call site branches on a profile's name.
package profile

import (
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Secret is a credential the profile needs brokered: the guest gets a placeholder in Env that the
// MITM swaps for the real value on Hosts only.
type Secret struct {
	// Name is the name of the secret in the host's secret store (nexus secret set NAME).
	Name string
	// Env is the guest variable that carries the placeholder.
	Env string
	// Hosts are the only hosts the placeholder is swapped on.
	Hosts []string
	// Kind is the credential kind (anthropic, github, openai, or empty for generic).
	Kind string
}

// Profile describes one agent.
type Profile struct {
	Name string
	// CredDirLiveMount mounts the host credential directory read-write into the guest instead of
	// seeding placeholders (claude-code: the guest refreshes its own OAuth token).
	CredDirLiveMount bool
	// CredDir is the host credential directory relative to $HOME (".claude").
	CredDir string
	// GuestCredPath is where CredDir appears in the guest ("/root/.claude").
	GuestCredPath string
	// CredentialsFile is the OAuth credentials file inside CredDir that the host CredGuardian
	// keeps fresh; empty when the profile has none.
	CredentialsFile string
	// EgressHosts is the entire allowlist the profile needs; everything else is denied unless the
	// user adds hosts.
	EgressHosts []string
	// CACertEnvVars name the variables set to the guest path of the MITM CA certificate.
	CACertEnvVars []string
	// GuestEnv is extra guest environment, e.g. telemetry switched off so nothing retries against
	// a default-deny perimeter.
	GuestEnv map[string]string
	// LaunchCommand starts the agent in the guest.
	LaunchCommand []string
	// Secrets are brokered credentials the profile seeds as placeholders.
	Secrets []Secret
}

// DefaultName is the profile used when --agent is omitted.
const DefaultName = "claude-code"

// registry holds every profile. Keep it declarative: values only.
var registry = []Profile{
	{
		Name:             "claude-code",
		CredDirLiveMount: true,
		CredDir:          ".claude",
		GuestCredPath:    "/root/.claude",
		CredentialsFile:  ".credentials.json",
		EgressHosts:      []string{"api.anthropic.com", "platform.claude.com"},
		CACertEnvVars:    []string{"NODE_EXTRA_CA_CERTS"},
		GuestEnv: map[string]string{
			"DISABLE_TELEMETRY":                        "1",
			"DISABLE_ERROR_REPORTING":                  "1",
			"DISABLE_AUTOUPDATER":                      "1",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
		},
		LaunchCommand: []string{"/usr/local/bin/claude", "--permission-mode", "auto"},
	},
	{
		Name:          "codex",
		EgressHosts:   []string{"api.openai.com"},
		CACertEnvVars: []string{"NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE"},
		LaunchCommand: []string{"/usr/local/bin/codex"},
		Secrets: []Secret{
			{Name: "OPENAI_API_KEY", Env: "OPENAI_API_KEY", Hosts: []string{"api.openai.com"}, Kind: "openai"},
		},
	},
}

// Get returns a copy of the named profile. An unknown name is refused, never defaulted: a typo
// must not be answered with the wrong credential delivery path.
func Get(name string) (Profile, error) {
	for _, p := range registry {
		if p.Name == name {
			return clone(p), nil
		}
	}
	return Profile{}, errdefs.Invalid("unknown agent profile %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Default returns the default profile (claude-code).
func Default() Profile {
	p, err := Get(DefaultName)
	if err != nil {
		panic("profile: default profile is not registered")
	}
	return p
}

// Names lists the registered profiles, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for _, p := range registry {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return names
}

// All returns copies of every registered profile, sorted by name.
func All() []Profile {
	out := make([]Profile, 0, len(registry))
	for _, n := range Names() {
		p, _ := Get(n)
		out = append(out, p)
	}
	return out
}

func clone(p Profile) Profile {
	p.EgressHosts = slices.Clone(p.EgressHosts)
	p.CACertEnvVars = slices.Clone(p.CACertEnvVars)
	p.GuestEnv = maps.Clone(p.GuestEnv)
	p.LaunchCommand = slices.Clone(p.LaunchCommand)
	secrets := make([]Secret, len(p.Secrets))
	for i, s := range p.Secrets {
		s.Hosts = slices.Clone(s.Hosts)
		secrets[i] = s
	}
	p.Secrets = secrets
	return p
}
