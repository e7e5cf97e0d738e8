// Command factor prints this machine's speed factor (hang.Factor) for
// scripts that bound a run by wall-clock time: `go run
// ./internal/hang/factor` prints it as a decimal, `-ceil` as the smallest
// integer not below it, `-v` with where it came from on stderr.
package main

import (
	"flag"
	"fmt"
	"math"
	"os"

	"github.com/goverbs/goverbs/internal/hang"
)

func main() {
	ceil := flag.Bool("ceil", false, "print the factor rounded up to an integer")
	verbose := flag.Bool("v", false, "say on stderr where the factor came from")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: factor [-ceil] [-v]")
		os.Exit(2)
	}
	f := hang.Factor()
	if *verbose {
		fmt.Fprintln(os.Stderr, hang.How())
	}
	if *ceil {
		fmt.Println(int(math.Ceil(f)))
		return
	}
	fmt.Printf("%.2f\n", f)
}
