package gateway

import "github.com/IniZio/nexus/pkg/httppolicy"

// ExplainRequest names a sandbox and a request: METHOD and an absolute http(s) URL, with an
// optional body (a GraphQL document, a push's pkt-lines).
type ExplainRequest struct {
	Name   string `json:"name"`
	Method string `json:"method"`
	URL    string `json:"url"`
	Body   string `json:"body,omitempty"`
}

// Explanation is the decision the perimeter would make, and which layer and rule made it.
type Explanation struct {
	Sandbox string `json:"sandbox"`
	Method  string `json:"method"`
	URL     string `json:"url"`
	Host    string `json:"host"`
	Port    int    `json:"port"`
	// Decision is "allow" or "deny".
	Decision string `json:"decision"`
	// Layer is what decided: "mode" (egress none/allow-all), "host" (the allowlist) or
	// "request" (the request policy).
	Layer  string `json:"layer"`
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
	// Credential says what happens to the guest's placeholder: "swapped NAME", "stripped" or "".
	Credential string `json:"credential,omitempty"`
	// Policy is the request policy consulted (repos, egress.policy, allowed branches).
	Policy *httppolicy.Policy `json:"policy,omitempty"`
}
