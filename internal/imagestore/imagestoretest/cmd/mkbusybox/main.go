// Command mkbusybox writes the test image of package imagestoretest (Debian's
// static busybox and a symlink per applet) for benchmarks and manual
// tests:
//
//	go run ./internal/imagestore/imagestoretest/cmd/mkbusybox -format oci -o /tmp/busybox-oci
//	go run ./internal/imagestore/imagestoretest/cmd/mkbusybox -format docker -o /tmp/busybox.tar -name busybox:test
//	go run ./internal/imagestore/imagestoretest/cmd/mkbusybox -format rootfs -o /tmp/busybox-rootfs
//
// -format oci writes an OCI image layout directory, docker a `docker save`
// tarball (for `docker load` or `tai42 image import`), rootfs a plain
// directory (for runc, or `tar -C DIR -c . | docker import - NAME`). It
// exits 1 with the reason when /bin/busybox is missing or not static, 2
// on a usage error.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
)

func main() {
	format := flag.String("format", "oci", "what to write: oci (an OCI image layout directory), docker (a docker save tarball) or rootfs (a plain directory)")
	out := flag.String("o", "", "the `PATH` to write: a new or empty directory (oci, rootfs) or a file (docker)")
	name := flag.String("name", "busybox:latest", "the image's `NAME` (oci, docker)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "mkbusybox: usage: mkbusybox -format oci|docker|rootfs -o PATH [-name NAME]")
		os.Exit(2)
	}
	var err error
	switch *format {
	case "oci":
		_, err = imagestoretest.WriteBusyboxLayout(*out, *name)
	case "docker":
		_, err = imagestoretest.WriteBusyboxDockerSave(*out, *name)
	case "rootfs":
		_, err = imagestoretest.WriteBusyboxRootfs(*out)
	default:
		fmt.Fprintf(os.Stderr, "mkbusybox: -format %q is not one of oci, docker, rootfs\n", *format)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkbusybox:", err)
		os.Exit(1)
	}
	fmt.Println(*out)
}
