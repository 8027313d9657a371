package cli

import (
	"strings"

	"github.com/spf13/cobra"
)

// examples is the Examples: section of every command whose definition has none, by its path
// after "nexus" (a test checks every runnable command has one).
var examples = map[string]string{
	"status":            "nexus status\nnexus status --json | jq -r '.[] | select(.up | not) | .service'",
	"create":            "nexus create demo/t1\nnexus create demo/t1 --image nexus-mini --memory 512m -l task=42\nnexus create demo/t2 --agent codex --allow-host pypi.org --repo acme/app\nnexus create demo/offline --egress none",
	"sandbox create":    "nexus sandbox create demo/t1 --image nexus-mini",
	"ps":                "nexus ps\nnexus ps -a -l task=42\nnexus ps --json | jq -r '.[].name'",
	"stats":             "nexus stats\nnexus stats demo/t1 --json",
	"cp":                "nexus cp ./src demo/t1:/workspace/         # a directory, into /workspace/src\nnexus cp demo/t1:/etc/hostname .\nnexus cp demo/t1:/var/log - | tar -tv         # a tar stream on stdout\ntar -c conf | nexus cp - demo/t1:/etc/app      # a tar stream from stdin",
	"logs":              "nexus logs demo/t1\nnexus logs -f --tail 20 demo/t1\nnexus logs --since 10m demo/t1\nnexus logs --agent demo/t1",
	"ports":             "nexus ports\nnexus ports demo/t1",
	"start":             "nexus start demo/t1\nnexus start -l task=42",
	"stop":              "nexus stop demo/t1\nnexus stop -f -l task=42",
	"pause":             "nexus pause demo/t1",
	"resume":            "nexus resume demo/t1",
	"rm":                "nexus rm demo/t1\nnexus rm -f -l task=42",
	"snapshot create":   "nexus snapshot create demo/t1 warm",
	"snapshot ls":       "nexus snapshot ls",
	"snapshot rm":       "nexus snapshot rm warm",
	"fork":              "nexus fork warm demo/t2\nnexus fork demo/t1 demo/t3       # snapshots demo/t1 as demo/t3-base first",
	"volume ls":         "nexus volume ls",
	"volume rm":         "nexus volume rm demo/t1 cache",
	"image build":       "nexus image build nexus-mini\nnexus image build nexus-base --force",
	"image ls":          "nexus image ls",
	"image rm":          "nexus image rm nexus-mini",
	"secret ls":         "nexus secret ls",
	"secret rm":         "nexus secret rm GITHUB_TOKEN",
	"audit tail":        "nexus audit tail --denied --since 10m\nnexus audit tail -f --sandbox demo/t1\nnexus audit tail --json | jq -c 'select(.decision==\"deny\")'\nnexus audit tail --api --token ci --since 1h",
	"egress show":       "nexus egress show demo/t1\nnexus egress show demo/t1 --json",
	"egress allow":      "nexus egress allow demo/t1 pypi.org\nnexus egress allow demo/t1 files.pythonhosted.org:443 --for 30m",
	"egress revoke":     "nexus egress revoke demo/t1 pypi.org",
	"egress deny":       "nexus egress deny demo/t1 '*.example.com'",
	"egress apply":      "nexus egress apply demo/t1\nnexus egress apply demo/t1 --config path/to/.nexus/config.yaml",
	"egress requests":   "nexus egress requests\nnexus egress requests -f",
	"egress approve":    "nexus egress approve r-1a2b3c4d\nnexus egress approve r-1a2b3c4d --for 1h --port 443",
	"egress reject":     "nexus egress reject r-1a2b3c4d",
	"config check":      "nexus config check\nnexus config check path/to/.nexus/config.yaml",
	"delegate create":   "nexus delegate create --name fix-login .\nnexus delegate create ~/src/app --base origin/main --agent codex",
	"delegate dispatch": "nexus delegate dispatch fix-login --brief 'Fix the login redirect; add a test'\nnexus delegate dispatch fix-login --brief-file brief.md -- /usr/local/bin/claude -p",
	"delegate poll":     "nexus delegate poll fix-login",
	"delegate teardown": "nexus delegate teardown fix-login\nnexus delegate teardown --force fix-login",
	"agent launch":      "nexus agent launch nexus-base /usr/local/bin/claude\nnexus agent launch --agent-egress nexus-base /usr/local/bin/claude",
	"herdr launch":      "nexus herdr launch --agent-egress nexus-base /usr/local/bin/claude",
	"mcp":               "claude mcp add --transport stdio nexus -- nexus mcp",
	"version":           "nexus version\nnexus version --json",
	"token create":      "nexus token create ci",
	"token ls":          "nexus token ls",
	"token revoke":      "nexus token revoke ci",
}

// addExamples fills the Examples: of the commands of root that define none, indented as
// cobra prints its own.
func addExamples(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if ex, ok := byPath(examples, root, c); ok && c.Example == "" {
			c.Example = "  " + strings.ReplaceAll(ex, "\n", "\n  ")
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// byPath is m's value for c by its path after the root's name; `nexus sandbox X`, an alias of
// `nexus X`, has X's unless it has its own.
func byPath[T any](m map[string]T, root, c *cobra.Command) (T, bool) {
	p := strings.TrimPrefix(c.CommandPath(), root.Name()+" ")
	v, ok := m[p]
	if alias, isAlias := strings.CutPrefix(p, "sandbox "); isAlias && !ok {
		v, ok = m[alias]
	}
	return v, ok
}
