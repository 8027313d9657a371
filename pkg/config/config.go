// Package config loads a project's .nexus/config.yaml (DESIGN §6): the egress hosts a sandbox
// working on the project may reach openly (egress.allow), the hosts it may reach only through a
// request policy (egress.policy: repos for GitHub hosts, "METHOD /glob" paths rules for any
// host, default-deny), the secrets brokered to it (egress.secrets), and the private networks
// its allowed names may lead to (egress.allow_private, as --allow-private).
//
//	version: 1
//	egress:
//	  allow:
//	    - registry.npmjs.org
//	  policy:
//	    github.com:
//	      repos: [acme/app]
//	    api.example.com:
//	      paths:
//	        - GET /v1/**
//	  secrets:
//	    - name: EXAMPLE_TOKEN
//	      hosts: [api.example.com]
//	      env: EXAMPLE_TOKEN
//	  allow_private:
//	    - 10.20.0.0/16
//
// The file is parsed through yaml.Node so every error names file:line. A host may be open or
// policy-gated, never both: that conflict is refused with the seed's exact message.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/pkg/policy"
)

// Version is the only schema version.
const Version = 1

// MaxBytes bounds a config file.
const MaxBytes = 1 << 20

// RelPath is where a project keeps its config, relative to the git root.
const RelPath = ".nexus/config.yaml"

// Config is a parsed, valid .nexus/config.yaml. It travels as JSON from the CLI to the gateway
// (CreateRequest.Config) and is recorded with the sandbox.
type Config struct {
	Version int    `json:"version"`
	Egress  Egress `json:"egress"`
	// Source is the file it was read from (informational).
	Source string `json:"source,omitempty"`
}

// Egress is the egress section.
type Egress struct {
	// Allow are open hosts, in --allow-host form HOST[:PORT[,PORT…]] ("*.example.com" allowed).
	Allow []string `json:"allow,omitempty"`
	// Policy are the policy-gated hosts, in file order.
	Policy []httppolicy.HostRules `json:"policy,omitempty"`
	// Secrets are brokered to the sandbox as placeholders.
	Secrets []Secret `json:"secrets,omitempty"`
	// Limits lower the sandbox's egress budgets (limits.go).
	Limits netapi.Limits `json:"limits,omitzero"`
	// AllowPrivate are CIDRs of non-public addresses (RFC 1918, CGNAT, link-local, ULA) that
	// allowed names may resolve to, as --allow-private; every other such address is refused.
	AllowPrivate []string `json:"allow_private,omitempty"`
	// Ask makes a query for a host off the list a pending request a person may approve
	// (`nexus egress requests`), as --egress-ask.
	Ask bool `json:"ask,omitempty"`
}

// Secret binds a named secret (`nexus secret set NAME`) to hosts, optionally under an extra
// guest variable.
type Secret struct {
	Name  string   `json:"name"`
	Hosts []string `json:"hosts"`
	Env   string   `json:"env,omitempty"`
	// Header is the request header the placeholder is swapped in (x-api-key), lower case;
	// empty means Authorization (Bearer, token or Basic).
	Header string `json:"header,omitempty"`
}

// ConflictError is the refusal of a host listed both open and policy-gated, word for word as the
// spec gives it.
func ConflictError(host string) error {
	return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("nexus config: host %q is listed under egress.allow and egress.policy; a host can be open (allow) or policy-gated (policy/secrets), not both — remove it from egress.allow", host))
}

var (
	secretNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
	envRE        = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)

// Load reads and parses the file at path.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.NotFound("nexus config: %s does not exist", path)
		}
		return nil, fmt.Errorf("nexus config: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("nexus config: %s: %w", path, err)
	}
	if len(b) > MaxBytes {
		return nil, errdefs.Invalid("nexus config: %s: larger than %d bytes", path, MaxBytes)
	}
	return Parse(path, b)
}

// Find returns the project config that applies to dir: .nexus/config.yaml at the root of the
// git work tree containing dir. It returns "" when dir is not in a work tree or the root has
// no config.
func Find(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
			p := filepath.Join(dir, RelPath)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
			return "", nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", nil
		}
		dir = parent
	}
}

// ForCreate is the config a new sandbox gets: the file at path when one is given, else the
// project config Find locates from the working directory (nil when there is none).
func ForCreate(path string) (*Config, error) {
	if path == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		if path, err = Find(wd); err != nil || path == "" {
			return nil, err
		}
	}
	return Load(path)
}

// Parse parses a config file's bytes; name is used in errors (file:line).
func Parse(name string, data []byte) (*Config, error) {
	if len(data) > MaxBytes {
		return nil, errdefs.Invalid("nexus config: %s: larger than %d bytes", name, MaxBytes)
	}
	p := &parser{name: name}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, p.errf(nil, "empty file: start it with `version: %d`", Version)
		}
		return nil, p.yamlErr(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, p.errf(&extra, "one YAML document only")
	}
	c, err := p.document(&doc)
	if err != nil {
		return nil, err
	}
	c.Source = name
	return c, nil
}

type parser struct{ name string }

// posError is an error at file:line.
func (p *parser) errf(n *yaml.Node, format string, a ...any) error {
	msg := errdefs.FirstLine(fmt.Sprintf(format, a...))
	if n == nil || n.Line == 0 {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("nexus config: %s: %s", p.name, msg))
	}
	return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("nexus config: %s:%d: %s", p.name, n.Line, msg))
}

// yamlErr turns a yaml.v3 syntax error ("yaml: line 3: …") into file:line form.
func (p *parser) yamlErr(err error) error {
	msg := errdefs.FirstLine(err.Error())
	msg = strings.TrimPrefix(msg, "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.Index(rest, ": "); i > 0 {
			return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("nexus config: %s:%s: %s", p.name, rest[:i], rest[i+2:]))
		}
	}
	return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("nexus config: %s: %s", p.name, msg))
}

func (p *parser) document(doc *yaml.Node) (*Config, error) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, p.errf(doc, "not a YAML document")
	}
	c := &Config{}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, p.errf(root, "empty file: start it with `version: %d`", Version)
	}
	var versionNode *yaml.Node
	err := p.mapping(root, "the top level", map[string]func(k, v *yaml.Node) error{
		"version": func(k, v *yaml.Node) error {
			versionNode = k
			s, err := p.scalar(v, "version")
			if err != nil {
				return err
			}
			if s != "1" {
				return p.errf(v, "version: %q is not supported; this nexus reads version: %d", clip(s), Version)
			}
			c.Version = Version
			return nil
		},
		"egress": func(_, v *yaml.Node) error { return p.egress(v, &c.Egress) },
	})
	if err != nil {
		return nil, err
	}
	if versionNode == nil {
		return nil, p.errf(root, "version: missing; add `version: %d`", Version)
	}
	if err := c.conflicts(); err != nil {
		return nil, err
	}
	return c, nil
}

func (p *parser) egress(n *yaml.Node, e *Egress) error {
	return p.mapping(n, "egress", map[string]func(k, v *yaml.Node) error{
		"allow": func(_, v *yaml.Node) error {
			return p.sequence(v, "egress.allow", func(item *yaml.Node) error {
				s, err := p.scalar(item, "egress.allow entry")
				if err != nil {
					return err
				}
				if err := checkAllow(s); err != nil {
					return p.errf(item, "egress.allow: %v", err)
				}
				e.Allow = append(e.Allow, s)
				return nil
			})
		},
		"policy": func(_, v *yaml.Node) error { return p.policy(v, e) },
		"secrets": func(_, v *yaml.Node) error {
			return p.sequence(v, "egress.secrets", func(item *yaml.Node) error { return p.secret(item, e) })
		},
		"limits": func(_, v *yaml.Node) error { return p.limits(v, &e.Limits) },
		"ask": func(_, v *yaml.Node) error {
			s, err := p.scalar(v, "egress.ask")
			if err != nil {
				return err
			}
			switch s {
			case "true":
				e.Ask = true
			case "false":
				e.Ask = false
			default:
				return p.errf(v, "egress.ask: %q is not true or false", s)
			}
			return nil
		},
		"allow_private": func(_, v *yaml.Node) error {
			return p.sequence(v, "egress.allow_private", func(item *yaml.Node) error {
				s, err := p.scalar(item, "egress.allow_private entry")
				if err != nil {
					return err
				}
				if _, err := netaddr.ParseAllowPrivate([]string{s}); err != nil {
					return p.errf(item, "egress.allow_private: %v", err)
				}
				e.AllowPrivate = append(e.AllowPrivate, s)
				return nil
			})
		},
	})
}

func (p *parser) policy(n *yaml.Node, e *Egress) error {
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "egress.policy: want a mapping of host: {repos: […]} or {paths: […]}")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		raw, err := p.scalar(k, "egress.policy host")
		if err != nil {
			return err
		}
		host, err := checkPolicyHost(raw)
		if err != nil {
			return p.errf(k, "egress.policy: %v", err)
		}
		if slices.ContainsFunc(e.Policy, func(h httppolicy.HostRules) bool { return h.Host == host }) {
			return p.errf(k, "egress.policy: host %s is listed twice", host)
		}
		hr := httppolicy.HostRules{Host: host}
		where := "egress.policy." + host
		err = p.mapping(v, where, map[string]func(k, v *yaml.Node) error{
			"repos": func(rk, rv *yaml.Node) error {
				if !httppolicy.IsGitHubHost(host) {
					return p.errf(rk, "%s: repos rules apply to %s, %s and %s only; use paths: [\"GET /path/**\"]", where,
						httppolicy.GitHubWeb, httppolicy.GitHubAPI, httppolicy.GitHubUploads)
				}
				return p.sequence(rv, where+".repos", func(item *yaml.Node) error {
					s, err := p.scalar(item, where+".repos entry")
					if err != nil {
						return err
					}
					repo, ok := httppolicy.ParseRepo(s)
					if !ok {
						return p.errf(item, "%s.repos: %q is not owner/repo", where, clip(s))
					}
					hr.Repos = append(hr.Repos, repo)
					return nil
				})
			},
			"paths": func(_, pv *yaml.Node) error {
				return p.sequence(pv, where+".paths", func(item *yaml.Node) error {
					s, err := p.scalar(item, where+".paths entry")
					if err != nil {
						return err
					}
					r, err := httppolicy.ParsePathRule(s)
					if err != nil {
						return p.errf(item, "%s.paths: %v", where, err)
					}
					hr.Paths = append(hr.Paths, r.String())
					return nil
				})
			},
		})
		if err != nil {
			return err
		}
		if len(hr.Repos) == 0 && len(hr.Paths) == 0 {
			return p.errf(k, "%s: give repos: [owner/repo] or paths: [\"GET /path/**\"]; a policy-gated host without rules allows nothing", where)
		}
		e.Policy = append(e.Policy, hr)
	}
	return nil
}

func (p *parser) secret(n *yaml.Node, e *Egress) error {
	var s Secret
	var seenHosts bool
	err := p.mapping(n, "egress.secrets entry", map[string]func(k, v *yaml.Node) error{
		"name": func(_, v *yaml.Node) error {
			name, err := p.scalar(v, "egress.secrets name")
			if err != nil {
				return err
			}
			if !secretNameRE.MatchString(name) {
				return p.errf(v, "egress.secrets: name %q may contain only letters, digits, '_', '-' and '.'", clip(name))
			}
			s.Name = name
			return nil
		},
		"hosts": func(_, v *yaml.Node) error {
			seenHosts = true
			return p.sequence(v, "egress.secrets hosts", func(item *yaml.Node) error {
				h, err := p.scalar(item, "egress.secrets host")
				if err != nil {
					return err
				}
				host, err := checkSecretHost(h)
				if err != nil {
					return p.errf(item, "egress.secrets: %v", err)
				}
				if !slices.Contains(s.Hosts, host) {
					s.Hosts = append(s.Hosts, host)
				}
				return nil
			})
		},
		"env": func(_, v *yaml.Node) error {
			env, err := p.scalar(v, "egress.secrets env")
			if err != nil {
				return err
			}
			if !envRE.MatchString(env) {
				return p.errf(v, "egress.secrets: env %q is not a variable name", clip(env))
			}
			s.Env = env
			return nil
		},
		"header": func(_, v *yaml.Node) error {
			h, err := p.scalar(v, "egress.secrets header")
			if err != nil {
				return err
			}
			if s.Header, err = credapi.CredentialHeader(h); err != nil {
				return p.errf(v, "egress.secrets: %v", err)
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	switch {
	case s.Name == "":
		return p.errf(n, "egress.secrets entry: name is missing")
	case !seenHosts || len(s.Hosts) == 0:
		return p.errf(n, "egress.secrets %s: hosts is missing; name the hosts the secret may be sent to", s.Name)
	case slices.ContainsFunc(e.Secrets, func(o Secret) bool { return o.Name == s.Name }):
		return p.errf(n, "egress.secrets: %s is listed twice", s.Name)
	}
	e.Secrets = append(e.Secrets, s)
	return nil
}

// mapping walks a mapping whose keys must be among fields; an unknown or repeated key is an
// error at its line.
func (p *parser) mapping(n *yaml.Node, where string, fields map[string]func(k, v *yaml.Node) error) error {
	if n.Kind == yaml.AliasNode {
		return p.errf(n, "%s: YAML aliases are not supported", where)
	}
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "%s: want a mapping with keys %s", where, keyList(fields))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key, err := p.scalar(k, where+" key")
		if err != nil {
			return err
		}
		f, ok := fields[key]
		if !ok {
			if key == "<<" {
				return p.errf(k, "%s: YAML merge keys are not supported", where)
			}
			return p.errf(k, "unknown key %q in %s (known: %s)", clip(key), where, keyList(fields))
		}
		if seen[key] {
			return p.errf(k, "%s: key %q is repeated", where, key)
		}
		seen[key] = true
		if v.Kind == yaml.AliasNode {
			return p.errf(v, "%s.%s: YAML aliases are not supported", where, key)
		}
		if err := f(k, v); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) sequence(n *yaml.Node, where string, each func(*yaml.Node) error) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // "allow:" with nothing under it
	}
	if n.Kind != yaml.SequenceNode {
		return p.errf(n, "%s: want a list", where)
	}
	for _, item := range n.Content {
		if err := each(item); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) scalar(n *yaml.Node, where string) (string, error) {
	switch {
	case n.Kind == yaml.AliasNode:
		return "", p.errf(n, "%s: YAML aliases are not supported", where)
	case n.Kind != yaml.ScalarNode:
		return "", p.errf(n, "%s: want a single value", where)
	case n.Tag == "!!null":
		return "", p.errf(n, "%s: empty value", where)
	}
	return n.Value, nil
}

func keyList(fields map[string]func(k, v *yaml.Node) error) string {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}

// checkAllow validates an egress.allow entry (the --allow-host form).
func checkAllow(s string) error {
	if _, err := policy.ParseRule(s); err != nil {
		return err
	}
	return nil
}

// checkPolicyHost validates an egress.policy host: an exact name, no port, no wildcard.
func checkPolicyHost(s string) (string, error) {
	if strings.ContainsAny(s, "*:/") {
		return "", errdefs.Invalid("host %q: policy hosts are exact names without a port or wildcard", clip(s))
	}
	return policy.NormalizeHost(s)
}

func checkSecretHost(s string) (string, error) {
	if strings.ContainsAny(s, "*:/") {
		return "", errdefs.Invalid("host %q: secret hosts are exact names without a port or wildcard", clip(s))
	}
	return policy.NormalizeHost(s)
}

// allowHost is the host part of an egress.allow entry, lower case.
func allowHost(s string) string {
	r, err := policy.ParseRule(s)
	if err != nil {
		return strings.ToLower(s)
	}
	return r.Host
}

// conflicts refuses a host both open and policy-gated, case-insensitively.
func (c *Config) conflicts() error {
	gated := map[string]bool{}
	for _, h := range c.Egress.Policy {
		gated[strings.ToLower(h.Host)] = true
	}
	for _, s := range c.Egress.Secrets {
		for _, h := range s.Hosts {
			gated[strings.ToLower(h)] = true
		}
	}
	for _, a := range c.Egress.Allow {
		if h := allowHost(a); gated[h] {
			return ConflictError(h)
		}
	}
	return nil
}

// Validate checks a Config that did not come from Parse (the gateway receives it as JSON):
// the same rules, without file positions.
func (c *Config) Validate() error {
	if c.Version != Version {
		return errdefs.Invalid("nexus config: version %d is not supported; this nexus reads version: %d", c.Version, Version)
	}
	for _, a := range c.Egress.Allow {
		if err := checkAllow(a); err != nil {
			return errdefs.Invalid("nexus config: egress.allow: %v", err)
		}
	}
	if _, err := netaddr.ParseAllowPrivate(c.Egress.AllowPrivate); err != nil {
		return errdefs.Invalid("nexus config: egress.allow_private: %v", err)
	}
	seen := map[string]bool{}
	for i, h := range c.Egress.Policy {
		host, err := checkPolicyHost(h.Host)
		if err != nil {
			return errdefs.Invalid("nexus config: egress.policy: %v", err)
		}
		if seen[host] {
			return errdefs.Invalid("nexus config: egress.policy: host %s is listed twice", host)
		}
		seen[host] = true
		if len(h.Repos) == 0 && len(h.Paths) == 0 {
			return errdefs.Invalid("nexus config: egress.policy.%s: give repos or paths", host)
		}
		c.Egress.Policy[i].Host = host
	}
	if _, err := httppolicy.New(httppolicy.Policy{Hosts: c.Egress.Policy}); err != nil {
		return errdefs.Invalid("nexus config: egress.policy: %v", err)
	}
	if err := checkLimits(c.Egress.Limits); err != nil {
		return err
	}
	names := map[string]bool{}
	for _, s := range c.Egress.Secrets {
		if !secretNameRE.MatchString(s.Name) || names[s.Name] {
			return errdefs.Invalid("nexus config: egress.secrets: bad or repeated name %q", clip(s.Name))
		}
		names[s.Name] = true
		if s.Env != "" && !envRE.MatchString(s.Env) {
			return errdefs.Invalid("nexus config: egress.secrets %s: env %q is not a variable name", s.Name, clip(s.Env))
		}
		if len(s.Hosts) == 0 {
			return errdefs.Invalid("nexus config: egress.secrets %s: hosts is missing", s.Name)
		}
		if _, err := credapi.CredentialHeader(s.Header); err != nil {
			return errdefs.Invalid("nexus config: egress.secrets %s: %v", s.Name, err)
		}
		for _, h := range s.Hosts {
			if _, err := checkSecretHost(h); err != nil {
				return errdefs.Invalid("nexus config: egress.secrets %s: %v", s.Name, err)
			}
		}
	}
	return c.conflicts()
}

// HTTPPolicy is the request policy of a sandbox bound to repos (--repo) under this config.
// A nil Config gives the repos-only policy.
func (c *Config) HTTPPolicy(repos []string) httppolicy.Policy {
	p := httppolicy.Policy{Repos: repos}
	if c != nil {
		p.Hosts = c.Egress.Policy
	}
	return p
}

// Hosts are the hosts the config lets a sandbox reach, in --allow-host form: the open hosts,
// the policy-gated hosts and the secrets' hosts.
func (c *Config) Hosts() []string {
	if c == nil {
		return nil
	}
	var out []string
	add := func(h string) {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	for _, a := range c.Egress.Allow {
		add(strings.ToLower(a))
	}
	for _, h := range c.Egress.Policy {
		add(h.Host)
	}
	for _, s := range c.Egress.Secrets {
		for _, h := range s.Hosts {
			add(h)
		}
	}
	return out
}

func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
