package procstat

import "testing"

func TestField(t *testing.T) {
	for _, name := range []string{"Threads", "VmRSS", "VmSize"} {
		n, err := Field(name)
		if err != nil {
			t.Fatalf("Field(%q): %v", name, err)
		}
		if n <= 0 {
			t.Errorf("Field(%q) = %d, want > 0", name, n)
		}
	}
	// "Vm" is a prefix of real lines, not a line of its own.
	for _, name := range []string{"NoSuchField", "Vm"} {
		if _, err := Field(name); err == nil {
			t.Errorf("Field(%q): no error", name)
		}
	}
}
