package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/tai42/sandbox/internal/buildversion"
)

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
// Left at "dev", the main module's version from the build info is used when
// it has one (go install module@version).
var version = "dev"

// buildVersion is the version tai42 reports.
func buildVersion() string { return buildversion.Of(version) }

// versionLine is "tai42 VERSION GOVERSION OS/ARCH".
func versionLine() string {
	return fmt.Sprintf("tai42 %s %s %s/%s", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func (c *cli) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, Go version and OS/architecture",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine()); err != nil {
				return &exitError{code: exitFailure, err: err}
			}
			return nil
		},
	}
}
