// Command mkrootfsimage turns a root filesystem tarball (mmdebstrap's
// output, or `tar -C DIR -c .`) into a `docker save` tarball of one
// layer, for `tai42 image import`:
//
//	mmdebstrap --variant=minbase bookworm /tmp/rootfs.tar
//	go run ./internal/imagestore/imagestoretest/cmd/mkrootfsimage -rootfs /tmp/rootfs.tar -o /tmp/debian.tar -name debian-tools
//	tai42 image import /tmp/debian.tar
//
// The image's config sets the environment (-env, repeatable; default
// Debian's PATH), the command /bin/sh and this machine's platform. It
// exits 1 with the reason when the tarball cannot be read or the image
// written, 2 on a usage error.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
)

// envFlags collects repeated -env K=V flags.
type envFlags []string

func (e *envFlags) String() string { return strings.Join(*e, " ") }

func (e *envFlags) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("%q is not K=V", v)
	}
	*e = append(*e, v)
	return nil
}

func main() {
	rootfs := flag.String("rootfs", "", "the root filesystem tarball (`FILE`, plain or gzip)")
	out := flag.String("o", "", "the docker save tarball to write (`FILE`)")
	name := flag.String("name", "", "the image's `NAME`, e.g. debian-tools (\":latest\" when untagged)")
	var env envFlags
	flag.Var(&env, "env", "an environment variable of the image, `K=V` (repeatable; default "+imagestoretest.DebianPath+")")
	flag.Parse()
	if *rootfs == "" || *out == "" || *name == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "mkrootfsimage: usage: mkrootfsimage -rootfs FILE -o FILE -name NAME [-env K=V]...")
		os.Exit(2)
	}
	cfg := imagestoretest.RootfsConfig{}
	if len(env) > 0 {
		cfg.Env = env
	}
	if _, err := imagestoretest.WriteRootfsDockerSave(*rootfs, *out, *name, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "mkrootfsimage:", err)
		os.Exit(1)
	}
	fmt.Println(*out)
}
