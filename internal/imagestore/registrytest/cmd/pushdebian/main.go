// Command pushdebian pushes the realistic Debian images of registrytest
// (built on a cache miss, see registrytest.BuildDebian) to a registry
// over plain HTTP, for bench/pull.sh:
//
//	pushdebian -registry 127.0.0.1:5000 [-cache DIR]
//
// It pushes REGISTRY/bench/python:v1 (base, python, top) and prints that
// reference and then, one a line, the digest and size of each of its
// layers.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/tai42/sandbox/internal/imagestore/registrytest"
)

func main() {
	reg := flag.String("registry", "", "the registry's HOST:PORT (plain HTTP)")
	cache := flag.String("cache", registrytest.CacheDir(), "where the Debian image is kept between runs")
	flag.Parse()
	if *reg == "" {
		fmt.Fprintln(os.Stderr, "usage: pushdebian -registry HOST:PORT [-cache DIR]")
		os.Exit(2)
	}
	if err := run(*reg, *cache); err != nil {
		fmt.Fprintln(os.Stderr, "pushdebian:", err)
		os.Exit(1)
	}
}

func run(reg, cache string) error {
	d, err := registrytest.BuildDebian(cache)
	if err != nil {
		return err
	}
	ref := reg + "/bench/python:v1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(r, d.Python); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	fmt.Println(ref)
	layers, err := d.Python.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		dg, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		fmt.Println(dg, size)
	}
	return nil
}
