// Command guestsrv is the server the port-forward end-to-end tests run in the guest, built
// statically: guestsrv MODE ADDR with MODE ws (WebSocket echo), echo (TCP echo) or sink (reads
// each connection to EOF and answers the byte count as 8 bytes big-endian).
package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/gorilla/websocket"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: guestsrv ws|echo|sink ADDR")
		os.Exit(2)
	}
	mode, addr := os.Args[1], os.Args[2]
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch mode {
	case "ws":
		up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
		http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer c.Close()
			for {
				t, msg, err := c.ReadMessage()
				if err != nil {
					return
				}
				if c.WriteMessage(t, msg) != nil {
					return
				}
			}
		}))
	case "echo", "sink":
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			go func() {
				defer c.Close()
				if mode == "echo" {
					io.Copy(c, c)
					return
				}
				n, _ := io.Copy(io.Discard, c)
				binary.Write(c, binary.BigEndian, n)
			}()
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", mode)
		os.Exit(2)
	}
}
