package executor

import (
	"os"
	"strconv"
	"strings"
)

// hostSocketBytes is the most of a body the kernel may hold between a write to the socket and the
// client's read: this host's largest TCP send buffer and, for a client on this host (a sidecar, a
// benchmark), its largest receive buffer — the maxima of tcp_wmem and tcp_rmem, or of wmem_max
// and rmem_max where set higher. 64 MiB where they cannot be read.
var hostSocketBytes = func() int64 {
	var total int64
	for _, pair := range [][2]string{{"ipv4/tcp_wmem", "core/wmem_max"}, {"ipv4/tcp_rmem", "core/rmem_max"}} {
		var most int64
		for _, name := range pair {
			b, err := os.ReadFile("/proc/sys/net/" + name)
			fields := strings.Fields(string(b))
			if err != nil || len(fields) == 0 {
				return 64 << 20
			}
			n, err := strconv.ParseInt(fields[len(fields)-1], 10, 64)
			if err != nil {
				return 64 << 20
			}
			most = max(most, n)
		}
		total += most
	}
	return total
}()
