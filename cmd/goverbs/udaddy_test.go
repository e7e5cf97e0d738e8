package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestUdaddyInterop runs goverbs udaddy against rdma-core's udaddy
// (rdmacm-utils) both ways and against itself: a SIDR exchange on the UDP
// port space (port 7174, fixed in udaddy), then 10 datagrams each way.
func TestUdaddyInterop(t *testing.T) {
	rxetest.Pair(t)
	udaddy := lookTool(t, "udaddy", "rdmacm-utils")
	for _, pair := range []struct{ server, client string }{
		{"goverbs", "udaddy"}, {"udaddy", "goverbs"}, {"goverbs", "goverbs"},
	} {
		t.Run(fmt.Sprintf("%s-server/%s-client", pair.server, pair.client), func(t *testing.T) {
			run := peerStarter(t, udaddy, "udaddy")
			srvRes, srvDone := run(pair.server, "-b", "10.99.0.2", "-C", "10", "-S", "100")
			waitCMListen(t, "10.99.0.2", udaddyPort, srvDone)
			cliRes, _ := run(pair.client, "-s", "10.99.0.2", "-b", "10.99.0.1", "-C", "10", "-S", "100")
			rc, rs := cliRes(), srvRes()
			for _, x := range []struct {
				who string
				r   result
			}{{pair.client + " client", rc}, {pair.server + " server", rs}} {
				if x.r.code != 0 || x.r.err != nil || !strings.Contains(x.r.stdout, "data transfers complete") || !strings.Contains(x.r.stdout, "return status 0") {
					t.Errorf("%s: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", x.who, x.r.code, x.r.err, x.r.stdout, x.r.stderr)
				}
			}
		})
	}
}
