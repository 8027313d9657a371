package agentproto

import "testing"

func TestSocketInode(t *testing.T) {
	data := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0200A8C0:9C40 0100A8C0:1B59 02 00000001:00000000 01:00000064 00000002     0        0 2222 2 0000000000000000 200 0 0 1 7
`)
	if got := SocketInode(data, 0x9C40); got != 2222 {
		t.Fatalf("inode of port 40000: %d", got)
	}
	if got := SocketInode(data, 7001); got != 0 {
		t.Fatalf("inode of an unused port: %d", got)
	}
}
