package mcp

import (
	"fmt"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
)

// Tool names: the 13 of the spec (seed "AI Agents") plus the gaps it lists (logs, ports,
// egress audit) and sandbox_get.
const (
	ToolSandboxCreate    = "sandbox_create"
	ToolSandboxList      = "sandbox_list"
	ToolSandboxGet       = "sandbox_get"
	ToolSandboxStart     = "sandbox_start"
	ToolSandboxStop      = "sandbox_stop"
	ToolSandboxPause     = "sandbox_pause"
	ToolSandboxResume    = "sandbox_resume"
	ToolSandboxRemove    = "sandbox_remove"
	ToolSandboxExec      = "sandbox_exec"
	ToolSandboxRun       = "sandbox_run"
	ToolSandboxLogs      = "sandbox_logs"
	ToolSandboxPorts     = "sandbox_ports"
	ToolEgressAudit      = "egress_audit"
	ToolWorktreeCreate   = "delegate_worktree_create"
	ToolAgentDispatch    = "delegate_agent_dispatch"
	ToolAgentPoll        = "delegate_agent_poll"
	ToolDelegateTeardown = "delegate_teardown"
)

// nameProp is the sandbox name argument every per-sandbox tool takes (alias: sandbox).
func nameProp() mcpgo.ToolOption {
	return mcpgo.WithString("name", mcpgo.Required(), mcpgo.Description("sandbox name: [project/]name (project defaults to \"default\"); sandbox is accepted as an alias"))
}

// hints are a tool's annotations (MCP's defaults, when unset, are the opposite of safe:
// destructive and open-world), and its title.
type hints struct {
	title                                        string
	readOnly, destructive, idempotent, openWorld bool
}

func (h hints) opt() mcpgo.ToolOption {
	return func(t *mcpgo.Tool) {
		t.Title = h.title
		t.Annotations = mcpgo.ToolAnnotation{Title: h.title, ReadOnlyHint: mcpgo.ToBoolPtr(h.readOnly),
			DestructiveHint: mcpgo.ToBoolPtr(h.destructive), IdempotentHint: mcpgo.ToBoolPtr(h.idempotent), OpenWorldHint: mcpgo.ToBoolPtr(h.openWorld)}
	}
}

// reader is the hints of a tool that only reads.
func reader(title string) mcpgo.ToolOption {
	return hints{title: title, readOnly: true, idempotent: true}.opt()
}

// CreateDescription is sandbox_create's description: what it mints, and the egress a new
// sandbox gets.
const CreateDescription = "Mint a new sandbox record (project, name, remove_on_exit) and leave it created; pass start: true to boot it in the same call " +
	"(the result then comes once its guest agent answers), or call sandbox_start. Egress is curated by default: only the agent profile's hosts " +
	"(claude-code: api.anthropic.com, platform.claude.com), allowed_hosts, the hosts of repos and those of the project config are reachable, " +
	"and every private, loopback or metadata address is refused; egress: none cuts it off, allow-all[=DURATION] opens it."

// ExecDescription is sandbox_exec's description, the result shape included.
const ExecDescription = "Run a command inside an existing sandbox and wait for it; returns {exit_code, stdout, stderr, stdout_bytes, stderr_bytes, " +
	"stdout_truncated, stderr_truncated, stdout_omitted, stderr_omitted, signal, error}. Output over 64 KiB per stream keeps its first and last 32 KiB " +
	"(a failing build's error is at the end) joined by a line saying how many bytes were left out: *_bytes count everything the command wrote, " +
	"*_omitted what was cut. signal is set when a signal killed it; error, when set, says why the command did not run or did not finish (e.g. not found, timed out)."

func (s *Server) tools() []toolDef {
	return []toolDef{
		{tool: mcpgo.NewTool(ToolSandboxCreate,
			mcpgo.WithDescription(CreateDescription),
			mcpgo.WithString("name", mcpgo.Required(), mcpgo.Description("sandbox name, or project/name")),
			mcpgo.WithString("project", mcpgo.Description("project of the sandbox (default \"default\")")),
			mcpgo.WithBoolean("remove_on_exit", mcpgo.Description("remove the sandbox when this MCP server exits")),
			mcpgo.WithBoolean("start", mcpgo.Description("boot the sandbox now, as sandbox_start would (default false: the sandbox stays created)")),
			mcpgo.WithBoolean("cold", mcpgo.Description("with start: boot the sandbox's VM even when a booted template of its image and size exists (default false: restore the template, much faster)")),
			mcpgo.WithString("image", mcpgo.Description("root image: nexus-base (default), nexus-mini, …")),
			mcpgo.WithInteger("memory", mcpgo.Description("memory in MiB (default 1024)"), mcpgo.Min(0)),
			mcpgo.WithInteger("vcpus", mcpgo.Description("virtual CPUs (default 1)"), mcpgo.Min(0)),
			mcpgo.WithString("agent", mcpgo.Description("agent profile (default claude-code); an unknown name is refused")),
			mcpgo.WithString("egress", mcpgo.Description("egress mode: curated (default), allow-all[=DURATION] or none")),
			mcpgo.WithArray("allowed_hosts", mcpgo.WithStringItems(), mcpgo.Description("hosts the sandbox may reach: host[:port]; a bare host means 443 and 80")),
			mcpgo.WithArray("allow_private", mcpgo.WithStringItems(), mcpgo.Description("private network CIDRs (RFC 1918, CGNAT, link-local, ULA) allowed names may lead to, e.g. 10.20.0.0/16; every other private, loopback or metadata address is refused")),
			mcpgo.WithArray("secrets", mcpgo.WithStringItems(), mcpgo.Description("named secrets from `nexus secret set` to broker: NAME@host[,host][:header=NAME]; only to hosts the secret was stored for (`nexus secret set NAME --host`)")),
			mcpgo.WithObject("labels", mcpgo.Description("labels key=value for selection"), mcpgo.AdditionalProperties(map[string]any{"type": "string"})),
			mcpgo.WithArray("repos", mcpgo.WithStringItems(), mcpgo.Description("GitHub repositories owner/repo to bind: allows github.com for them, brokers GH_TOKEN, and gates pushes and API writes to them")),
			mcpgo.WithString("config", mcpgo.Description("project config file (.nexus/config.yaml) on the host; default: .nexus/config.yaml at the git root of this server's working directory, if any")),
			mcpgo.WithString("ttl", mcpgo.Description("remove the sandbox this long after create, whatever its state: 30m, 2h, 7d (default: never)")),
			mcpgo.WithString("idle_timeout", mcpgo.Description("pause the sandbox after this long without exec, port or network activity and under 5% CPU; the next exec resumes it: 10m, 1h (default: never)")),
			mcpgo.WithString("disk", mcpgo.Description("root disk size: 20g, 512m or plain MiB, at least the image's; sparse, refused when the host's free space could not hold it (default: the image's own size)")),
			mcpgo.WithString("disk_bps", mcpgo.Description(fmt.Sprintf("most bytes the sandbox's disks read, and apart write, per second, a size such as 64m (default %dm)", api.DefaultDiskBps>>20))),
			mcpgo.WithInteger("disk_iops", mcpgo.Description(fmt.Sprintf("most reads, and apart writes, the sandbox's disks do per second (default %d)", api.DefaultDiskIOPS)), mcpgo.Min(0)),
			mcpgo.WithInteger("max_conns", mcpgo.Description(fmt.Sprintf("egress budget: most connections and UDP flows open at once (default %d)", netapi.DefaultLimits.MaxConns)), mcpgo.Min(0)),
			mcpgo.WithInteger("conn_rate", mcpgo.Description(fmt.Sprintf("egress budget: most new connections per second (default %d)", netapi.DefaultLimits.ConnRate)), mcpgo.Min(0)),
			mcpgo.WithInteger("dns_rate", mcpgo.Description(fmt.Sprintf("egress budget: most DNS queries per second (default %d)", netapi.DefaultLimits.DNSRate)), mcpgo.Min(0)),
			mcpgo.WithString("egress_bandwidth", mcpgo.Description(fmt.Sprintf("egress budget: most bytes sent out per second, a size such as 10m (default %dm)", netapi.DefaultLimits.EgressBandwidth>>20))),
			mcpgo.WithString("ingress_bandwidth", mcpgo.Description(fmt.Sprintf("most bytes per second received from outside, a size such as 10m (default %dm)", netapi.DefaultLimits.IngressBandwidth>>20))),
			hints{title: "Create sandbox"}.opt(), mcpgo.WithOutputSchema[api.Sandbox](),
		), handler: s.sandboxCreate},
		{tool: mcpgo.NewTool(ToolSandboxList,
			mcpgo.WithDescription("List sandboxes with their state, image, agent, egress and labels"),
			mcpgo.WithBoolean("all", mcpgo.Description("include stopped and failed sandboxes (default true)"), mcpgo.DefaultBool(true)),
			mcpgo.WithString("selector", mcpgo.Description("label selector: k=v, k!=v or k, comma-separated")),
			reader("List sandboxes"), mcpgo.WithOutputSchema[listResult](),
		), handler: s.sandboxList},
		{tool: mcpgo.NewTool(ToolSandboxGet,
			mcpgo.WithDescription("Show one sandbox's record: state (and why it failed), image, resources, egress, mounts"),
			nameProp(), reader("Show sandbox"), mcpgo.WithOutputSchema[api.Sandbox](),
		), handler: s.sandboxGet},
		{tool: mcpgo.NewTool(ToolSandboxStart, mcpgo.WithDescription("Start a created or stopped sandbox (a paused one is resumed); returns once its guest agent answers"), nameProp(),
			hints{title: "Start sandbox", idempotent: true}.opt(), mcpgo.WithOutputSchema[applyResult]()), handler: s.applyVerb(ToolSandboxStart)},
		{tool: mcpgo.NewTool(ToolSandboxStop, mcpgo.WithDescription("Stop a running sandbox; its disk is kept, its processes end"), nameProp(),
			mcpgo.WithBoolean("force", mcpgo.Description("kill the VM instead of a clean shutdown")),
			hints{title: "Stop sandbox", destructive: true, idempotent: true}.opt(), mcpgo.WithOutputSchema[applyResult]()), handler: s.applyVerb(ToolSandboxStop)},
		{tool: mcpgo.NewTool(ToolSandboxPause, mcpgo.WithDescription("Pause a running sandbox"), nameProp(),
			hints{title: "Pause sandbox", idempotent: true}.opt(), mcpgo.WithOutputSchema[applyResult]()), handler: s.applyVerb(ToolSandboxPause)},
		{tool: mcpgo.NewTool(ToolSandboxResume, mcpgo.WithDescription("Resume a paused sandbox"), nameProp(),
			hints{title: "Resume sandbox", idempotent: true}.opt(), mcpgo.WithOutputSchema[applyResult]()), handler: s.applyVerb(ToolSandboxResume)},
		{tool: mcpgo.NewTool(ToolSandboxRemove, mcpgo.WithDescription("Remove a sandbox record and everything it owns (VM, disk, network)"), nameProp(),
			mcpgo.WithBoolean("force", mcpgo.Description("remove it even if it is running (default true)"), mcpgo.DefaultBool(true)),
			hints{title: "Remove sandbox", destructive: true, idempotent: true}.opt(), mcpgo.WithOutputSchema[applyResult]()), handler: s.applyVerb(ToolSandboxRemove)},
		{tool: mcpgo.NewTool(ToolSandboxExec,
			mcpgo.WithDescription(ExecDescription),
			nameProp(),
			mcpgo.WithArray("argv", mcpgo.Required(), mcpgo.WithStringItems(), mcpgo.MinItems(1), mcpgo.Description("command and arguments, e.g. [\"sh\",\"-c\",\"make test\"]")),
			mcpgo.WithArray("env", mcpgo.WithStringItems(), mcpgo.Description("extra environment: KEY=VALUE")),
			mcpgo.WithString("workdir", mcpgo.Description("working directory in the guest")),
			mcpgo.WithString("stdin", mcpgo.Description("text written to the command's stdin, then closed")),
			mcpgo.WithString("timeout", mcpgo.Description("kill the command after this long, e.g. 30s or 5m (default 10m); exit code 124")),
			hints{title: "Run command in sandbox", destructive: true, openWorld: true}.opt(), mcpgo.WithOutputSchema[ExecResult](),
		), handler: s.sandboxExec},
		{tool: mcpgo.NewTool(ToolSandboxRun,
			mcpgo.WithDescription("Ephemeral create+boot+exec+remove in one call. The sandbox is removed unconditionally: on success, on error and on timeout. "+
				"Returns the sandbox_exec result plus the sandbox name (and remove_error if removing it failed)."),
			mcpgo.WithString("image", mcpgo.Required(), mcpgo.Description("root image, e.g. nexus-base or nexus-mini")),
			mcpgo.WithArray("argv", mcpgo.Required(), mcpgo.WithStringItems(), mcpgo.Description("command and arguments; [] runs the image's Entrypoint followed by its Cmd (an image built or pulled with them), as nexus exec without a command does")),
			mcpgo.WithInteger("memory", mcpgo.Description("memory in MiB (default 1024)"), mcpgo.Min(0)),
			mcpgo.WithInteger("vcpus", mcpgo.Description("virtual CPUs (default 1)"), mcpgo.Min(0)),
			mcpgo.WithString("project", mcpgo.Description("project of the sandbox (default \"default\")")),
			mcpgo.WithString("name", mcpgo.Description("sandbox name (default run-<random>)")),
			mcpgo.WithArray("env", mcpgo.WithStringItems(), mcpgo.Description("extra environment: KEY=VALUE")),
			mcpgo.WithString("stdin", mcpgo.Description("text written to the command's stdin, then closed")),
			mcpgo.WithString("timeout", mcpgo.Description("kill the command after this long (default 10m); exit code 124")),
			hints{title: "Run command in a throwaway sandbox", openWorld: true}.opt(), mcpgo.WithOutputSchema[ExecResult](),
		), handler: s.sandboxRun},
		{tool: mcpgo.NewTool(ToolSandboxLogs,
			mcpgo.WithDescription("Read a sandbox's console log (kernel and guest agent) from a cursor; call again with next_cursor to follow it"),
			nameProp(),
			mcpgo.WithString("cursor", mcpgo.Description("next_cursor of the previous call; omit to read from the start")),
			mcpgo.WithInteger("max_bytes", mcpgo.Description("at most this many bytes (default and cap 65536)"), mcpgo.Min(0)),
			reader("Read sandbox console log"), mcpgo.WithOutputSchema[LogsResult](),
		), handler: s.sandboxLogs},
		{tool: mcpgo.NewTool(ToolSandboxPorts,
			mcpgo.WithDescription("List the guest listeners forwarded to 127.0.0.1 on the host at the same port"),
			nameProp(), reader("List forwarded ports"), mcpgo.WithOutputSchema[PortsResult](),
		), handler: s.sandboxPorts},
		{tool: mcpgo.NewTool(ToolEgressAudit,
			mcpgo.WithDescription("Recent egress decisions (dns, l4, tls, http, credential swaps, git relay) of a sandbox, oldest first; a denial's rule says which check refused it"),
			nameProp(),
			mcpgo.WithInteger("limit", mcpgo.Description("at most this many of the most recent events (default 100, cap 1000)"), mcpgo.Min(0)),
			mcpgo.WithString("since", mcpgo.Description("only events newer than this, e.g. 15m or 24h (default: all kept)")),
			mcpgo.WithBoolean("denied", mcpgo.Description("only denied decisions")),
			reader("Egress audit of a sandbox"), mcpgo.WithOutputSchema[AuditResult](),
		), handler: s.egressAudit},
		{tool: mcpgo.NewTool(ToolWorktreeCreate,
			mcpgo.WithDescription("Create a git worktree of a host repo on a new branch nexus/<name> and a sandbox with it mounted at /workspace. "+
				"allowed_branches is rejected if set: the branch policy is derived from the worktree's branch."),
			mcpgo.WithString("repo_path", mcpgo.Required(), mcpgo.Description("absolute path of a git repository on the host")),
			mcpgo.WithString("name", mcpgo.Description("delegation name: branch nexus/<name>, sandbox <name> (default task-<random>)")),
			mcpgo.WithString("base", mcpgo.Description("commit-ish the branch starts from (default HEAD)")),
			mcpgo.WithString("project", mcpgo.Description("project of the sandbox (default \"default\")")),
			mcpgo.WithString("image", mcpgo.Description("root image (default nexus-base; it has git)")),
			mcpgo.WithInteger("memory", mcpgo.Description("memory in MiB (default 1024)"), mcpgo.Min(0)),
			mcpgo.WithInteger("vcpus", mcpgo.Description("virtual CPUs (default 1)"), mcpgo.Min(0)),
			mcpgo.WithString("agent", mcpgo.Description("agent profile (default claude-code)")),
			mcpgo.WithString("egress", mcpgo.Description("egress mode: curated (default), allow-all[=DURATION] or none")),
			mcpgo.WithArray("allowed_hosts", mcpgo.WithStringItems(), mcpgo.Description("extra hosts the sandbox may reach")),
			hints{title: "Delegate a worktree"}.opt(), mcpgo.WithOutputSchema[api.WorktreeResult](),
		), handler: s.delegateWorktreeCreate, refuse: map[string]string{
			"allowed_branches": "allowed_branches is not accepted: the branch policy is derived from the worktree's branch (nexus/<name>)"}},
		{tool: mcpgo.NewTool(ToolAgentDispatch,
			mcpgo.WithDescription("Submit a brief to the in-guest agent of a delegation sandbox: the brief is written to "+api.BriefPath+
				" and the profile's launch command is started detached, fed the brief on stdin. Returns once the brief is delivered, not when the work is done."),
			nameProp(),
			mcpgo.WithString("brief", mcpgo.Required(), mcpgo.Description("the task, in prose")),
			mcpgo.WithArray("command", mcpgo.WithStringItems(), mcpgo.Description("launch this instead of the agent profile's command (absolute path first)")),
			hints{title: "Dispatch a brief to the delegated agent", openWorld: true}.opt(), mcpgo.WithOutputSchema[api.DispatchResult](),
		), handler: s.delegateAgentDispatch},
		{tool: mcpgo.NewTool(ToolAgentPoll,
			mcpgo.WithDescription("Progress of a delegation: the worktree's branch, its recent commits (git log --oneline) and git status --porcelain"),
			nameProp(),
			mcpgo.WithInteger("commits", mcpgo.Description("how many recent commits (default 10, cap 100)"), mcpgo.Min(0)),
			reader("Poll a delegation"), mcpgo.WithOutputSchema[api.PollResult](),
		), handler: s.delegateAgentPoll},
		{tool: mcpgo.NewTool(ToolDelegateTeardown,
			mcpgo.WithDescription("Remove a delegation's sandbox and its worktree (the branch and its commits stay). "+
				"A dirty worktree returns a structured error listing the changed files unless force is true, which discards them."),
			nameProp(),
			mcpgo.WithBoolean("force", mcpgo.Description("discard uncommitted changes")),
			hints{title: "Tear down a delegation", destructive: true, idempotent: true}.opt(), mcpgo.WithOutputSchema[api.TeardownResult](),
		), handler: s.delegateTeardown},
	}
}
