// Command testinit is a tiny PID 1 for boot tests: it loads the modules listed in
// /etc/nexus/modules (with their parameters from the kernel command line, as the agent does),
// reports what the guest sees on the console, and powers off.
//
// Console lines it prints: "VIRTIO-PORT <name>", "BLOCK <dev> serial=<s>", "NET <if>",
// "ROOT ext4 busybox=<size> write=true" (nexus.testroot=1), "9P <content of hello>", "TESTINIT-DONE"; with nexus.testwait=1 it then prints "TICK <n>" every
// 100 ms instead of powering off.
package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "testinit: must run as PID 1 in a guest")
		os.Exit(2)
	}
	os.MkdirAll("/dev", 0o755)
	unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	unix.Mount("proc", "/proc", "proc", 0, "")
	unix.Mount("sysfs", "/sys", "sysfs", 0, "")

	cmdline, _ := os.ReadFile("/proc/cmdline")
	params := map[string][]string{}
	flags := map[string]string{}
	for _, tok := range strings.Fields(string(cmdline)) {
		k, v, _ := strings.Cut(tok, "=")
		flags[k] = v
		if mod, p, ok := strings.Cut(k, "."); ok && !strings.HasPrefix(k, "nexus.") {
			mod = strings.ReplaceAll(mod, "-", "_")
			params[mod] = append(params[mod], p+"="+v)
		}
	}
	start := time.Now()
	n := loadModules(params)
	fmt.Printf("MODULES %d in %v\n", n, time.Since(start).Round(time.Millisecond))

	waitFor(func() bool { m, _ := filepath.Glob("/sys/class/virtio-ports/*/name"); return len(m) > 0 })
	names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, f := range names {
		b, _ := os.ReadFile(f)
		fmt.Printf("VIRTIO-PORT %s\n", strings.TrimSpace(string(b)))
	}
	waitFor(func() bool { _, err := os.Stat("/dev/vda"); return err == nil })
	blocks, _ := filepath.Glob("/sys/block/vd*")
	sort.Strings(blocks)
	for _, b := range blocks {
		serial, _ := os.ReadFile(b + "/serial")
		dev := filepath.Base(b)
		_, err := os.Stat("/dev/" + dev)
		fmt.Printf("BLOCK %s serial=%s node=%v\n", dev, strings.TrimSpace(string(serial)), err == nil)
	}
	nets, _ := filepath.Glob("/sys/class/net/*")
	for _, n := range nets {
		if filepath.Base(n) != "lo" {
			fmt.Printf("NET %s\n", filepath.Base(n))
		}
	}
	if flags["nexus.testroot"] == "1" {
		os.MkdirAll("/mnt/root", 0o755)
		if err := unix.Mount("/dev/vda", "/mnt/root", "ext4", 0, ""); err != nil {
			fmt.Printf("ROOT mount error %v\n", err)
		} else if st, err := os.Stat("/mnt/root/bin/busybox"); err != nil {
			fmt.Printf("ROOT stat error %v\n", err)
		} else {
			werr := os.WriteFile("/mnt/root/tmp/written", []byte("x"), 0o644)
			fmt.Printf("ROOT ext4 busybox=%d write=%v\n", st.Size(), werr == nil)
			unix.Unmount("/mnt/root", 0)
		}
	}
	if tag := flags["nexus.test9p"]; tag != "" {
		os.MkdirAll("/mnt/9p", 0o755)
		if err := unix.Mount(tag, "/mnt/9p", "9p", 0, "trans=virtio,version=9p2000.L"); err != nil {
			fmt.Printf("9P mount error %v\n", err)
		} else if b, err := os.ReadFile("/mnt/9p/hello"); err != nil {
			fmt.Printf("9P read error %v\n", err)
		} else {
			fmt.Printf("9P %s\n", strings.TrimSpace(string(b)))
		}
	}
	fmt.Println("TESTINIT-DONE")
	if flags["nexus.testwait"] == "1" {
		for i := 0; ; i++ {
			fmt.Printf("TICK %d\n", i)
			time.Sleep(100 * time.Millisecond)
		}
	}
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

func loadModules(params map[string][]string) int {
	f, err := os.Open("/etc/nexus/modules")
	if err != nil {
		fmt.Printf("MODULES error %v\n", err)
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" || strings.HasPrefix(p, "#") { // section markers: the test loads them all
			continue
		}
		name := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(p), ".ko"), "-", "_")
		mf, err := os.Open(p)
		if err != nil {
			fmt.Printf("MODULE %s error %v\n", name, err)
			continue
		}
		err = unix.FinitModule(int(mf.Fd()), strings.Join(params[name], " "), 0)
		mf.Close()
		if err != nil && err != unix.EEXIST {
			fmt.Printf("MODULE %s error %v\n", name, err)
			continue
		}
		n++
	}
	return n
}

func waitFor(cond func() bool) {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}
