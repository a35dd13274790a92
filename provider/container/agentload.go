package container

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// agentLibDir is where a dynamically linked agent's loader and libraries
// are bound in a session.
const agentLibDir = "/.tai42/lib"

// agentLoad is how a session runs the agent binary. A static binary is
// bound at agentPath and executed; a dynamically linked one (tai42 built
// with cgo, the default where a C compiler is installed) needs its dynamic
// loader and libraries, which an image may not have (a static busybox
// image has no libc) or may have in other versions: the files the binary
// needs, resolved on the host when the provider starts, are bound one by
// one read-only under agentLibDir, and PID 1 is the loader, given the
// binary and that directory explicitly. Nothing is put in the agent's
// environment, so the commands it starts run with the image's own loader
// and libraries and see no LD_* variable; and no other file of the host
// enters a session. (A DT_RPATH, which the loader searches before the
// library path it is given, would name directories of the image in a
// session; Go's linker writes none unless asked, with -ldflags -r.)
type agentLoad struct {
	binary string // the binary on the host
	loader string // the loader's path in a session; "" when static
	libs   []bind // the loader and the libraries, into agentLibDir
}

// args is PID 1's command line.
func (a agentLoad) args() []string { return a.run("agent", "--listen-fd", "3") }

// run is the command line of the agent binary run with args in a session.
func (a agentLoad) run(args ...string) []string {
	cmd := append([]string{agentPath}, args...)
	if a.loader == "" {
		return cmd
	}
	// The loader, invoked as a command, runs the program it is given
	// with argv[0] that program: the agent sees the command line it would
	// have run with directly.
	return append([]string{a.loader, "--library-path", agentLibDir}, cmd...)
}

// loadAgent reads the ELF file binary and resolves, when it is
// dynamically linked, its loader (PT_INTERP) and every library it needs
// (DT_NEEDED, recursively), searched as the loader searches: the object's
// DT_RPATH (and the executable's) unless it has a DT_RUNPATH, its
// DT_RUNPATH, the directories of /etc/ld.so.conf, the default ones; a
// candidate of another ELF class or machine is passed over, as the loader
// does. It fails when binary is not an ELF executable,
// when a needed library is not found (naming the library and the object
// that needs it), or when a library is needed by a path.
func loadAgent(binary string) (agentLoad, error) {
	a := agentLoad{binary: binary}
	f, err := elf.Open(binary)
	if err != nil {
		return a, fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return a, fmt.Errorf("not an ELF executable (ELF type %v)", f.Type)
	}
	interp, err := interpOf(f)
	if err != nil || interp == "" {
		return a, err
	}
	r := &resolver{
		class: f.Class, machine: f.Machine, exe: f, exeFile: binary,
		names: map[string]string{},
		conf:  ldConfDirs("/etc/ld.so.conf"),
	}
	loader, err := filepath.EvalSymlinks(interp)
	if err != nil {
		return a, fmt.Errorf("its dynamic loader %s: %w", interp, err)
	}
	if err := r.compatible(loader); err != nil {
		return a, fmt.Errorf("its dynamic loader %s: %w", interp, err)
	}
	// The libraries that name the loader (libc does) get the loaded one:
	// the loader knows itself by that name.
	r.add(path.Base(interp), loader)
	a.loader = agentLibDir + "/" + path.Base(interp)
	if err := r.walk(f, binary); err != nil {
		return a, err
	}
	for _, name := range r.order {
		a.libs = append(a.libs, bind{source: r.names[name], dest: agentLibDir + "/" + name})
	}
	return a, nil
}

// interpOf is f's PT_INTERP, "" when it has none.
func interpOf(f *elf.File) (string, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", fmt.Errorf("its PT_INTERP: %w", err)
		}
		s := strings.TrimRight(string(b), "\x00")
		if !filepath.IsAbs(s) {
			return "", fmt.Errorf("its dynamic loader %q is not an absolute path", s)
		}
		return s, nil
	}
	return "", nil
}

// resolver finds the libraries an executable needs.
type resolver struct {
	class   elf.Class
	machine elf.Machine
	exe     *elf.File
	exeFile string
	names   map[string]string // needed name -> the file on the host
	order   []string          // names in the order found
	conf    []string          // the directories of ld.so.conf
}

func (r *resolver) add(name, file string) {
	r.names[name] = file
	r.order = append(r.order, name)
}

// walk resolves what obj (the file at file) needs, and then what that
// needs.
func (r *resolver) walk(obj *elf.File, file string) error {
	needed, err := obj.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: its needed libraries: %w", file, err)
	}
	for _, name := range needed {
		if _, ok := r.names[name]; ok {
			continue
		}
		if strings.Contains(name, "/") {
			return fmt.Errorf("%s needs the library %q by its path, which a session does not have", file, name)
		}
		found, err := r.find(name, obj, file)
		if err != nil {
			return err
		}
		r.add(name, found)
		lib, err := elf.Open(found)
		if err != nil {
			return fmt.Errorf("the library %s: %w", found, err)
		}
		err = r.walk(lib, found)
		lib.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// find is the file the loader would load for name, needed by obj (the
// file at file), its symbolic links resolved.
func (r *resolver) find(name string, obj *elf.File, file string) (string, error) {
	var dirs []string
	runpath := dynPaths(obj, elf.DT_RUNPATH, file)
	if len(runpath) == 0 {
		dirs = append(dirs, dynPaths(obj, elf.DT_RPATH, file)...)
		if obj != r.exe && len(dynPaths(r.exe, elf.DT_RUNPATH, r.exeFile)) == 0 {
			dirs = append(dirs, dynPaths(r.exe, elf.DT_RPATH, r.exeFile)...)
		}
	}
	dirs = append(dirs, runpath...)
	dirs = append(dirs, r.conf...)
	dirs = append(dirs, defaultLibDirs(r.machine, r.class)...)
	var passed []string
	for _, d := range dirs {
		cand := filepath.Join(d, name)
		if _, err := os.Stat(cand); err != nil {
			continue
		}
		if err := r.compatible(cand); err != nil {
			passed = append(passed, fmt.Sprintf("%s (%v)", cand, err))
			continue
		}
		resolved, err := filepath.EvalSymlinks(cand)
		if err != nil {
			return "", fmt.Errorf("the library %s: %w", cand, err)
		}
		return resolved, nil
	}
	msg := fmt.Sprintf("the library %s, which %s needs, is not found in %s", name, file, strings.Join(slices.Compact(dirs), ":"))
	if len(passed) > 0 {
		msg += "; passed over: " + strings.Join(passed, ", ")
	}
	return "", errors.New(msg)
}

// compatible says why the file at name is not a library the loader of the
// executable would take: not an ELF file, or one of another class or
// machine.
func (r *resolver) compatible(name string) error {
	f, err := elf.Open(name)
	if err != nil {
		return fmt.Errorf("not an ELF file: %w", err)
	}
	defer f.Close()
	if f.Class != r.class || f.Machine != r.machine {
		return fmt.Errorf("an ELF file for %v %v, not %v %v", f.Class, f.Machine, r.class, r.machine)
	}
	return nil
}

// dynPaths is obj's DT_RPATH or DT_RUNPATH (tag) as directories, $ORIGIN
// expanded to the directory of file, obj's file. Entries with another
// dynamic string token ($LIB, $PLATFORM) are left out: the loader would
// look in a directory named by the machine it runs on.
func dynPaths(obj *elf.File, tag elf.DynTag, file string) []string {
	vals, err := obj.DynString(tag)
	if err != nil {
		return nil
	}
	origin := ""
	if resolved, err := filepath.EvalSymlinks(file); err == nil {
		origin = filepath.Dir(resolved)
	}
	var dirs []string
	for _, v := range vals {
		for d := range strings.SplitSeq(v, ":") {
			if d == "" {
				continue
			}
			if strings.Contains(d, "$ORIGIN") || strings.Contains(d, "${ORIGIN}") {
				if origin == "" {
					continue
				}
				d = strings.NewReplacer("${ORIGIN}", origin, "$ORIGIN", origin).Replace(d)
			}
			if strings.Contains(d, "$") || !filepath.IsAbs(d) {
				continue
			}
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// ldConfDirs are the library directories /etc/ld.so.conf (conf) names,
// its includes followed, in order: what ldconfig builds the loader's cache
// of. A file that cannot be read names none.
func ldConfDirs(conf string) []string {
	var dirs []string
	seen := map[string]bool{}
	var read func(name string, depth int)
	read = func(name string, depth int) {
		if depth > 8 || seen[name] {
			return
		}
		seen[name] = true
		f, err := os.Open(name)
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line, _, _ := strings.Cut(sc.Text(), "#")
			fields := strings.FieldsFunc(line, func(c rune) bool {
				return c == ' ' || c == '\t' || c == ':' || c == ','
			})
			if len(fields) == 0 {
				continue
			}
			switch fields[0] {
			case "include":
				for _, pat := range fields[1:] {
					if !filepath.IsAbs(pat) {
						pat = filepath.Join(filepath.Dir(name), pat)
					}
					matches, _ := filepath.Glob(pat)
					slices.Sort(matches)
					for _, m := range matches {
						read(m, depth+1)
					}
				}
			case "hwcap":
			default:
				for _, d := range fields {
					if filepath.IsAbs(d) {
						dirs = append(dirs, filepath.Clean(d))
					}
				}
			}
		}
	}
	read(conf, 0)
	return dirs
}

// defaultLibDirs are the directories the loader searches last: the
// multiarch ones of the machine (Debian's), then the traditional ones.
func defaultLibDirs(m elf.Machine, c elf.Class) []string {
	triplet := map[elf.Machine]string{
		elf.EM_X86_64:  "x86_64-linux-gnu",
		elf.EM_386:     "i386-linux-gnu",
		elf.EM_AARCH64: "aarch64-linux-gnu",
		elf.EM_ARM:     "arm-linux-gnueabihf",
		elf.EM_RISCV:   "riscv64-linux-gnu",
		elf.EM_PPC64:   "powerpc64le-linux-gnu",
		elf.EM_S390:    "s390x-linux-gnu",
		elf.EM_MIPS:    "mips64el-linux-gnuabi64",
	}[m]
	var dirs []string
	if triplet != "" {
		dirs = append(dirs, "/lib/"+triplet, "/usr/lib/"+triplet)
	}
	if c == elf.ELFCLASS64 {
		dirs = append(dirs, "/lib64", "/usr/lib64")
	}
	return append(dirs, "/lib", "/usr/lib")
}
