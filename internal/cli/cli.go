// Package cli holds what the module's commands share on their command
// line: getopt-style flag parsing (ParseGetopt), an error carrying an exit
// status (ExitError, ExitCoder) and the mapping of a command's error to the
// process's exit status and message (Exit). cmd/goverbs and the test tools
// under internal/cmd use it.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ExitCoder is an error that carries the exit status of the process; Exit
// prints its message (if not empty) and returns the status.
type ExitCoder interface {
	error
	ExitCode() int
}

// ExitError is an ExitCoder: Msg may be empty when the message was printed
// already (flag's usage, for one).
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

// ExitCode returns e.Code.
func (e *ExitError) ExitCode() int { return e.Code }

// Exit maps the error a command returned to the process's exit status,
// printing "prog: message" to stderr: 0 for nil and flag.ErrHelp, the
// status of an ExitCoder in err's chain, 1 for any other error.
func Exit(prog string, err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ec ExitCoder
	if errors.As(err, &ec) {
		if msg := ec.Error(); msg != "" {
			fmt.Fprintf(stderr, "%s: %s\n", prog, msg)
		}
		return ec.ExitCode()
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return 1
}

// ParseGetopt parses args the way getopt_long does for the rdma-core tools,
// with Go's flag package doing the value parsing: flags and operands may be
// mixed ("goverbs rc-pingpong 10.0.0.2 -n 10"), short options may be
// clustered or take their value attached ("-ce", "-p18515", "-n10"), long
// options take "--name=value" or "--name value". A single-dash word that
// names a defined long flag ("-iters 10") is taken as that flag, as Go
// users would expect. It returns the operands; on a bad flag, after fs has
// printed the error and its usage, an *ExitError of status 1 and no
// message.
func ParseGetopt(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, operands []string
	needsValue := func(f *flag.Flag) bool {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			return false
		}
		return true
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			operands = append(operands, args[i+1:]...)
			i = len(args)
		case a == "-" || !strings.HasPrefix(a, "-"):
			operands = append(operands, a)
		default:
			name := strings.TrimLeft(a, "-")
			name, _, hasValue := strings.Cut(name, "=")
			f := fs.Lookup(name)
			if strings.HasPrefix(a, "--") || (f != nil && len(name) > 1) || len(a) == 2 {
				flags = append(flags, a)
				if f != nil && needsValue(f) && !hasValue && i+1 < len(args) {
					i++
					flags = append(flags, args[i])
				}
				continue
			}
			// A cluster of short options: -ce, -p18515, -n10.
			cl := a[1:]
			for j := 0; j < len(cl); j++ {
				sf := fs.Lookup(cl[j : j+1])
				if sf == nil || !needsValue(sf) {
					flags = append(flags, "-"+cl[j:j+1]) // an unknown one makes Parse fail
					continue
				}
				if j+1 < len(cl) {
					flags = append(flags, "-"+cl[j:j+1], cl[j+1:])
				} else {
					flags = append(flags, "-"+cl[j:j+1])
					if i+1 < len(args) {
						i++
						flags = append(flags, args[i])
					}
				}
				break
			}
		}
	}
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &ExitError{Code: 1} // flag already printed the error and usage
	}
	return append(operands, fs.Args()...), nil
}
