// Package units formats quantities for error messages and reports.
package units

import (
	"strconv"
	"strings"
)

var byteUnits = [...]string{"B", "KiB", "MiB", "GiB", "TiB"}

// Bytes formats n in binary units with one decimal, the ".0" dropped:
// "512 B", "1 MiB", "63.8 MiB".
func Bytes(n int64) string {
	v, u := float64(n), 0
	s := oneDecimal(v)
	// What rounds to 1024 of a unit (1023.96 KiB) is 1 of the next.
	for (v >= 1024 || v <= -1024 || s == "1024" || s == "-1024") && u < len(byteUnits)-1 {
		v /= 1024
		u++
		s = oneDecimal(v)
	}
	return s + " " + byteUnits[u]
}

func oneDecimal(v float64) string {
	return strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0")
}
