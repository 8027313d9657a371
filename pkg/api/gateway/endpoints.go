package gateway

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
)

// Lifecycle is the shape of the verbs applied to several sandboxes by name or selector.
type Lifecycle = bus.Endpoint[NamesRequest, []Result]

// Endpoints of the gateway API, on nexus.gateway.<verb>: what the CLI and the MCP server call.
// The worktree delegation endpoints are declared with their types in delegate.go.
var (
	Create = bus.Endpoint[CreateRequest, *Sandbox]{Scope: bus.GatewayAPI, Verb: "sandbox.create"}
	Get    = bus.Endpoint[NameRequest, *Sandbox]{Scope: bus.GatewayAPI, Verb: "sandbox.get", Read: true}
	List   = bus.Endpoint[ListRequest, SandboxPage]{Scope: bus.GatewayAPI, Verb: "sandbox.list", Read: true}
	Start  = Lifecycle{Scope: bus.GatewayAPI, Verb: "sandbox.start"}
	Stop   = Lifecycle{Scope: bus.GatewayAPI, Verb: "sandbox.stop"}
	Pause  = Lifecycle{Scope: bus.GatewayAPI, Verb: "sandbox.pause"}
	Resume = Lifecycle{Scope: bus.GatewayAPI, Verb: "sandbox.resume"}
	Remove = Lifecycle{Scope: bus.GatewayAPI, Verb: "sandbox.remove"}
	Exec   = bus.Endpoint[ExecRequest, Started]{Scope: bus.GatewayAPI, Verb: "sandbox.exec"}
	Copy   = bus.Endpoint[CopyRequest, Started]{Scope: bus.GatewayAPI, Verb: "sandbox.copy"}
	Logs   = bus.Endpoint[LogsRequest, LogsResponse]{Scope: bus.GatewayAPI, Verb: "sandbox.logs", Read: true}
	Fork   = bus.Endpoint[ForkRequest, *Sandbox]{Scope: bus.GatewayAPI, Verb: "sandbox.fork"}
	// Ports lists the port forwards of one sandbox by name, or of all when the name is empty.
	Ports = bus.Endpoint[PortsRequest, []portfwdapi.Forward]{Scope: bus.GatewayAPI, Verb: "sandbox.ports", Read: true}

	// Images and Image are forwarded to the vmm of the gateway's host.
	Images = bus.Endpoint[Empty, []vmmapi.ImageInfo]{Scope: bus.GatewayAPI, Verb: "image.list", Read: true}
	Image  = bus.Endpoint[vmmapi.ImageRequest, vmmapi.ImageInfo]{Scope: bus.GatewayAPI, Verb: "image.op"}

	// The secret verbs are forwarded to credbroker, EgressShow asks the netstack too, and
	// EgressExplain judges a request against a sandbox's perimeter without sending it.
	SecretSet     = bus.Endpoint[credapi.SecretSetRequest, Empty]{Scope: bus.GatewayAPI, Verb: "secret.set"}
	SecretList    = bus.Endpoint[Empty, credapi.SecretListResponse]{Scope: bus.GatewayAPI, Verb: "secret.list", Read: true}
	SecretRemove  = bus.Endpoint[credapi.SecretRemoveRequest, Empty]{Scope: bus.GatewayAPI, Verb: "secret.remove"}
	EgressShow    = bus.Endpoint[NameRequest, EgressView]{Scope: bus.GatewayAPI, Verb: "egress.show", Read: true}
	EgressExplain = bus.Endpoint[ExplainRequest, Explanation]{Scope: bus.GatewayAPI, Verb: "egress.explain", Read: true}

	SnapshotCreate = bus.Endpoint[SnapshotCreateRequest, *Snapshot]{Scope: bus.GatewayAPI, Verb: "snapshot.create"}
	SnapshotList   = bus.Endpoint[Empty, []SnapshotView]{Scope: bus.GatewayAPI, Verb: "snapshot.list", Read: true}
	SnapshotRemove = bus.Endpoint[SnapshotRemoveRequest, Empty]{Scope: bus.GatewayAPI, Verb: "snapshot.remove"}
	VolumeList     = bus.Endpoint[Empty, []VolumeView]{Scope: bus.GatewayAPI, Verb: "volume.list", Read: true}
	VolumeRemove   = bus.Endpoint[VolumeRemoveRequest, Empty]{Scope: bus.GatewayAPI, Verb: "volume.remove"}
)

// Endpoints lists every endpoint of the contract (the bus tests check their permissions).
var Endpoints = []bus.Route{
	Create, Get, List, Start, Stop, Pause, Resume, Remove, Exec, Copy, Logs, Fork, Ports,
	Images, Image, SecretSet, SecretList, SecretRemove, EgressShow, EgressExplain,
	SnapshotCreate, SnapshotList, SnapshotRemove, VolumeList, VolumeRemove,
	DelegateCreate, DelegateDispatch, DelegatePoll, DelegateTeardown, // delegate.go
	Stats,                                                                                           // stats.go
	EgressAllow, EgressRevoke, EgressDeny, EgressApply, EgressRequests, EgressApprove, EgressReject, // egress_live.go
	EgressWhy, // why.go
}

// PortsRequest names one sandbox, or none for all of them.
type PortsRequest struct {
	Name string `json:"name,omitempty"`
}

// Client is the typed client of the gateway API used by the CLI and the MCP server.
type Client struct{ nc *nats.Conn }

// NewClient returns a gateway client over nc.
func NewClient(nc *nats.Conn) *Client { return &Client{nc: nc} }

// Conn is the underlying bus connection (streams use it directly).
func (c *Client) Conn() *nats.Conn { return c.nc }

func (c *Client) Create(ctx context.Context, r CreateRequest) (*Sandbox, error) {
	return Create.Call(ctx, c.nc, "", r)
}
func (c *Client) Get(ctx context.Context, name string) (*Sandbox, error) {
	return Get.Call(ctx, c.nc, "", NameRequest{Name: name})
}

// List is every sandbox r selects, sorted by name, read page by page (ListPage or
// ListPageBytes each, until an empty page).
func (c *Client) List(ctx context.Context, r ListRequest) ([]SandboxView, error) {
	r.Limit, r.MaxBytes = ListPage, ListPageBytes
	var out []SandboxView
	for {
		page, err := List.Call(ctx, c.nc, "", r)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 || !after(page[len(page)-1].Name, r.After) {
			if out == nil {
				out = []SandboxView{} // none: an empty list, not null
			}
			return out, nil
		}
		out = append(out, page...)
		r.After = page[len(page)-1].Name
	}
}

// after says a page that ends at last came after the one that ended at prev: a gateway pages by
// name, and one that sends the same page again (it ignores After) ends the listing instead of
// repeating it forever.
func after(last, prev string) bool { return prev == "" || last > prev }

// ListInto is List decoding each sandbox into a T: a type of SandboxView's JSON shape with only
// the fields its caller reads (the ps table). name is a T's sandbox name, where the next page
// starts.
func ListInto[T any](ctx context.Context, c *Client, r ListRequest, name func(*T) string) ([]T, error) {
	r.Limit, r.MaxBytes = ListPage, ListPageBytes
	var out []T
	for {
		page := make([]T, 0, r.Limit) // decoded in place, not grown 12 times per page
		if err := List.CallInto(ctx, c.nc, "", r, &page); err != nil {
			return nil, err
		}
		if len(page) == 0 || !after(name(&page[len(page)-1]), r.After) {
			if out == nil {
				out = []T{}
			}
			return out, nil
		}
		if out == nil {
			out = page
		} else {
			out = append(out, page...)
		}
		r.After = name(&page[len(page)-1])
	}
}

// ListJSON is List as the gateway encodes it, for a caller that prints it (ps --json): one JSON
// array of every sandbox r selects, by name, joined from the pages' arrays without decoding
// them. r.Limit and r.MaxBytes, when set below ListPage and ListPageBytes, bound a page.
func (c *Client) ListJSON(ctx context.Context, r ListRequest) ([]byte, error) {
	if r.Limit <= 0 || r.Limit > ListPage {
		r.Limit = ListPage
	}
	if r.MaxBytes <= 0 || r.MaxBytes > ListPageBytes {
		r.MaxBytes = ListPageBytes
	}
	out := []byte{'['}
	for {
		raw, err := List.CallJSON(ctx, c.nc, "", r)
		if err != nil {
			return nil, err
		}
		elems, err := arrayElements(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", List.Subject(""), err)
		}
		if len(elems) == 0 {
			return append(out, ']'), nil
		}
		var last struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(elems[len(elems)-1], &last); err != nil || last.Name == "" {
			return nil, fmt.Errorf("%s: a sandbox without a name in the reply", List.Subject(""))
		}
		if !after(last.Name, r.After) {
			return append(out, ']'), nil
		}
		for _, e := range elems {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, e...)
		}
		r.After = last.Name
	}
}

// Apply runs one of Start, Stop, Pause, Resume and Remove on the sandboxes r names.
func (c *Client) Apply(ctx context.Context, verb Lifecycle, r NamesRequest) ([]Result, error) {
	return verb.Call(ctx, c.nc, "", r)
}

// Exec and Copy start a session on the caller's stream (r.SID) and name the host that serves
// it, which the caller binds the stream to (stream.Session.Bind).
func (c *Client) Exec(ctx context.Context, r ExecRequest) (Started, error) {
	return Exec.Call(ctx, c.nc, "", r)
}
func (c *Client) Copy(ctx context.Context, r CopyRequest) (Started, error) {
	return Copy.Call(ctx, c.nc, "", r)
}
func (c *Client) Logs(ctx context.Context, r LogsRequest) (LogsResponse, error) {
	return Logs.Call(ctx, c.nc, "", r)
}
func (c *Client) Fork(ctx context.Context, r ForkRequest) (*Sandbox, error) {
	return Fork.Call(ctx, c.nc, "", r)
}
func (c *Client) Ports(ctx context.Context, name string) ([]portfwdapi.Forward, error) {
	return Ports.Call(ctx, c.nc, "", PortsRequest{Name: name})
}
func (c *Client) Images(ctx context.Context) ([]vmmapi.ImageInfo, error) {
	return Images.Call(ctx, c.nc, "", Empty{})
}
func (c *Client) Image(ctx context.Context, r vmmapi.ImageRequest) (vmmapi.ImageInfo, error) {
	return Image.Call(ctx, c.nc, "", r)
}
func (c *Client) SecretSet(ctx context.Context, r credapi.SecretSetRequest) error {
	_, err := SecretSet.Call(ctx, c.nc, "", r)
	return err
}
func (c *Client) SecretList(ctx context.Context) (credapi.SecretListResponse, error) {
	return SecretList.Call(ctx, c.nc, "", Empty{})
}
func (c *Client) SecretRemove(ctx context.Context, name string) error {
	_, err := SecretRemove.Call(ctx, c.nc, "", credapi.SecretRemoveRequest{Name: name})
	return err
}
func (c *Client) EgressShow(ctx context.Context, name string) (EgressView, error) {
	return EgressShow.Call(ctx, c.nc, "", NameRequest{Name: name})
}
func (c *Client) EgressExplain(ctx context.Context, r ExplainRequest) (Explanation, error) {
	return EgressExplain.Call(ctx, c.nc, "", r)
}
func (c *Client) SnapshotCreate(ctx context.Context, r SnapshotCreateRequest) (*Snapshot, error) {
	return SnapshotCreate.Call(ctx, c.nc, "", r)
}
func (c *Client) SnapshotList(ctx context.Context) ([]SnapshotView, error) {
	return SnapshotList.Call(ctx, c.nc, "", Empty{})
}
func (c *Client) SnapshotRemove(ctx context.Context, name string) error {
	_, err := SnapshotRemove.Call(ctx, c.nc, "", SnapshotRemoveRequest{Snapshot: name})
	return err
}
func (c *Client) VolumeList(ctx context.Context) ([]VolumeView, error) {
	return VolumeList.Call(ctx, c.nc, "", Empty{})
}
func (c *Client) VolumeRemove(ctx context.Context, r VolumeRemoveRequest) error {
	_, err := VolumeRemove.Call(ctx, c.nc, "", r)
	return err
}
