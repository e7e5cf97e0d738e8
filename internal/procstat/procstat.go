// Package procstat reads this process's /proc/self/status.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Field is the number in the named line of /proc/self/status ("VmRSS",
// "VmSize", "Threads", ...), in the file's own unit (kB for the Vm lines).
func Field(name string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0, fmt.Errorf("procstat: empty %s line in /proc/self/status", name)
			}
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("procstat: %s in /proc/self/status: %w", name, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("procstat: no %s line in /proc/self/status", name)
}
