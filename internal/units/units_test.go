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
	} {
		if got := Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
