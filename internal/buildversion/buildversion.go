// Package buildversion is the version a tai42 binary reports (tai42,
// tai42-agent).
package buildversion

import "runtime/debug"

// Of is the version of a binary whose link-time version (-ldflags "-X
// main.version=v1.2.3") is linked: linked itself unless it was left at
// "dev", then the main module's version from the build info when it has
// one (go install module@version), else "dev".
func Of(linked string) string {
	if linked != "dev" && linked != "" {
		return linked
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
