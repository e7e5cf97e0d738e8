package units

import "testing"

func TestBytes(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {512, "512 B"}, {1023, "1023 B"}, {1024, "1 KiB"}, {1536, "1.5 KiB"},
		{1 << 20, "1 MiB"}, {66900000, "63.8 MiB"}, {4 << 30, "4 GiB"}, {1 << 40, "1 TiB"},
		{1 << 50, "1024 TiB"}, {-2048, "-2 KiB"},
		// What rounds up to 1024 of a unit prints as 1 of the next.
		{1<<20 - 1, "1 MiB"}, {1<<10*1023 + 1000, "1 MiB"}, {-(1<<30 - 1), "-1 GiB"},
		{1<<10*1023 + 972, "1023.9 KiB"}, {1<<40 - 1, "1 TiB"},
	} {
		if got := Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
