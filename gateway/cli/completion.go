package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/profile"
)

// lister lists the names of one kind of thing for completion, from the running stack.
type lister func(ctx context.Context, c *api.Client) ([]string, error)

func sandboxNames(ctx context.Context, c *api.Client) ([]string, error) {
	list, err := c.List(ctx, api.ListRequest{All: true})
	var out []string
	for _, s := range list {
		out = append(out, s.Name)
	}
	return out, err
}

func imageNames(ctx context.Context, c *api.Client) ([]string, error) {
	list, err := c.Images(ctx)
	var out []string
	for _, i := range list {
		out = append(out, i.Name)
	}
	return out, err
}

func snapshotNames(ctx context.Context, c *api.Client) ([]string, error) {
	list, err := c.SnapshotList(ctx)
	var out []string
	for _, s := range list {
		out = append(out, s.Name)
	}
	return out, err
}

func secretNames(ctx context.Context, c *api.Client) ([]string, error) {
	list, err := c.SecretList(ctx)
	var out []string
	for _, s := range list.Secrets {
		out = append(out, s.Name)
	}
	return out, err
}

// volumesOf lists the named volumes of the sandbox given as the first argument.
func volumesOf(sandbox string) lister {
	return func(ctx context.Context, c *api.Client) ([]string, error) {
		name, _ := api.ParseName(sandbox)
		list, err := c.VolumeList(ctx)
		var out []string
		for _, v := range list {
			if v.Sandbox == name || v.Sandbox == sandbox {
				out = append(out, v.Name)
			}
		}
		return out, err
	}
}

// completeNames asks the stack for names (nothing when it is down), never files.
func completeNames(cmd *cobra.Command, list lister, prefix string) ([]string, cobra.ShellCompDirective) {
	c, _, err := dial(cmd)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	names, _ := list(ctx, c)
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// argNames completes the positional argument at position n (-1: every one) from list.
func argNames(n int, list lister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if n >= 0 && len(args) != n {
			return nil, cobra.ShellCompDirectiveDefault
		}
		return completeNames(cmd, list, toComplete)
	}
}

// completion wires the dynamic completion of names into the tree: sandboxes, images,
// snapshots, volumes, secrets and agent profiles, as arguments and as flag values.
func completion(root *cobra.Command) {
	args := map[string]cobra.CompletionFunc{
		"attach": argNames(0, sandboxNames), "exec": argNames(0, sandboxNames), "logs": argNames(0, sandboxNames),
		"ports": argNames(0, sandboxNames), "stats": argNames(-1, sandboxNames),
		"start": argNames(-1, sandboxNames), "stop": argNames(-1, sandboxNames), "pause": argNames(-1, sandboxNames),
		"resume": argNames(-1, sandboxNames), "rm": argNames(-1, sandboxNames),
		"egress show": argNames(0, sandboxNames), "egress allow": argNames(0, sandboxNames), "egress revoke": argNames(0, sandboxNames),
		"egress deny": argNames(0, sandboxNames), "egress apply": argNames(0, sandboxNames), "egress explain": argNames(0, sandboxNames),
		"snapshot create": argNames(0, sandboxNames), "snapshot rm": argNames(0, snapshotNames),
		"fork": argNames(0, func(ctx context.Context, c *api.Client) ([]string, error) {
			snaps, err := snapshotNames(ctx, c)
			boxes, _ := sandboxNames(ctx, c)
			return append(snaps, boxes...), err
		}),
		"delegate dispatch": argNames(0, sandboxNames), "delegate poll": argNames(0, sandboxNames),
		"delegate teardown": argNames(0, sandboxNames),
		"image rm":          argNames(0, imageNames), "image build": argNames(0, func(context.Context, *api.Client) ([]string, error) {
			return []string{"nexus-base", "nexus-mini"}, nil
		}),
		"agent launch": argNames(0, imageNames), "herdr launch": argNames(0, imageNames),
		"secret rm": argNames(0, secretNames), "secret set": argNames(0, secretNames),
		"volume rm": func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			switch len(args) {
			case 0:
				return completeNames(cmd, sandboxNames, toComplete)
			case 1:
				return completeNames(cmd, volumesOf(args[0]), toComplete)
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		"cp": func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if strings.Contains(toComplete, ":") {
				return nil, cobra.ShellCompDirectiveNoFileComp // a guest path: not ours to list
			}
			names, _ := completeNames(cmd, sandboxNames, toComplete)
			for i, n := range names {
				names[i] = n + ":/"
			}
			return names, cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveDefault
		},
	}
	profiles := func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return profile.Names(), cobra.ShellCompDirectiveNoFileComp
	}
	images := func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return completeNames(cmd, imageNames, toComplete)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if fn, ok := byPath(args, root, c); ok && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = fn
		}
		if c.Flags().Lookup("agent") != nil {
			c.RegisterFlagCompletionFunc("agent", profiles)
		}
		if c.Flags().Lookup("image") != nil {
			c.RegisterFlagCompletionFunc("image", images)
		}
		if c.Flags().Lookup("sandbox") != nil {
			c.RegisterFlagCompletionFunc("sandbox", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				return completeNames(cmd, sandboxNames, toComplete)
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
