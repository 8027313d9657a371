// Command nexus is the one binary of nexus: the CLI, `nexus up` (every service around an
// embedded bus in one process) and `nexus serve <service>` (one service per process).
//
// This file is the composition root: it alone imports the gateway and the services and wires
// them together; the gateway and the services know each other only through the bus.
package main

import (
	"os"

	"github.com/IniZio/nexus/gateway/cli"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == qemu.JailCommand {
		os.Exit(qemu.JailMain(os.Args[2:])) // the vmm starting a contained QEMU
	}
	if len(os.Args) > 1 && os.Args[1] == image.ExtractCommand {
		os.Exit(image.ExtractMain(os.Args[2:])) // the vmm extracting an image's layers
	}
	root := cli.NewRoot()
	root.AddCommand(upCommand(), serveCommand())
	os.Exit(cli.Execute(root))
}
