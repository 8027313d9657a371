package mitm

import (
	"net/http"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

// requestPolicy compiles the request policy a sandbox was registered with (bound repos,
// .nexus/config.yaml egress.policy, allowed branches) into the proxy's HTTPPolicy. It is nil
// when the policy gates nothing.
func requestPolicy(p mitmapi.SandboxPolicy) (HTTPPolicy, error) {
	if p.Requests == nil || p.Requests.Empty() {
		return nil, nil
	}
	eng, err := httppolicy.New(*p.Requests)
	if err != nil {
		return nil, errdefs.Invalid("mitm: sandbox %s: request policy: %v", p.ID, err)
	}
	return HTTPPolicyFunc(func(r *http.Request, host string) Verdict {
		d := eng.Decide(r, host)
		if d.Rule == httppolicy.RuleOpenHost {
			return Verdict{} // no policy gates the host: its audit rule stays host_allowed
		}
		return Verdict{Deny: !d.Allow, Rule: d.Rule, Reason: d.Reason, StripCredential: d.StripCredential}
	}), nil
}
