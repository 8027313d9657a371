package initramfs

import (
	"bytes"
	"encoding/binary"
)

// ProbeMarker is the line the probe init writes to the console.
const ProbeMarker = "NEXUS-PROBE-OK"

// probeCode is x86-64 machine code (assembled once with GNU as, bytes checked with objdump):
//
//	mov eax,1; mov edi,1; lea rsi,[rip+msg]; mov edx,15; syscall   ; write(1, msg, 15)
//	mov eax,39; syscall; cmp eax,1; jne exit                       ; getpid() != 1 → exit(0)
//	mov eax,169; mov edi,0xfee1dead; mov esi,0x28121969;
//	mov edx,0x4321fedc; syscall                                    ; reboot(POWER_OFF)
//	hang: jmp hang
//	exit: mov eax,60; xor edi,edi; syscall
//	msg: "NEXUS-PROBE-OK\n"
//
// The getpid guard makes it harmless to run outside a VM: it prints and exits.
var probeCode = []byte{
	0xb8, 0x01, 0x00, 0x00, 0x00, 0xbf, 0x01, 0x00, 0x00, 0x00, 0x48, 0x8d,
	0x35, 0x34, 0x00, 0x00, 0x00, 0xba, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05,
	0xb8, 0x27, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x83, 0xf8, 0x01, 0x75, 0x18,
	0xb8, 0xa9, 0x00, 0x00, 0x00, 0xbf, 0xad, 0xde, 0xe1, 0xfe, 0xbe, 0x69,
	0x19, 0x12, 0x28, 0xba, 0xdc, 0xfe, 0x21, 0x43, 0x0f, 0x05, 0xeb, 0xfe,
	0xb8, 0x3c, 0x00, 0x00, 0x00, 0x31, 0xff, 0x0f, 0x05,
	'N', 'E', 'X', 'U', 'S', '-', 'P', 'R', 'O', 'B', 'E', '-', 'O', 'K', '\n',
}

// ProbeInit returns a minimal static x86-64 ELF executable that, as PID 1, writes ProbeMarker
// to its stdout (the console) and powers the machine off. It needs no libc and no modules, so
// it measures bare kernel boot to /init and proves an accelerator can run a guest.
func ProbeInit() []byte { return staticELF(probeCode) }

// SleepMarker is the line the sleeper init writes to the console before it sleeps.
const SleepMarker = "NEXUS-SLEEP-OK"

// sleepCode is x86-64 machine code (assembled once with GNU as, bytes checked with objdump):
//
//	mov eax,1; mov edi,1; lea rsi,[rip+msg]; mov edx,15; syscall   ; write(1, msg, 15)
//	again: mov eax,34; syscall; jmp again                          ; pause() for ever
//	msg: "NEXUS-SLEEP-OK\n"
var sleepCode = []byte{
	0xb8, 0x01, 0x00, 0x00, 0x00, 0xbf, 0x01, 0x00, 0x00, 0x00, 0x48, 0x8d,
	0x35, 0x10, 0x00, 0x00, 0x00, 0xba, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05,
	0xb8, 0x22, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xf7,
	'N', 'E', 'X', 'U', 'S', '-', 'S', 'L', 'E', 'E', 'P', '-', 'O', 'K', '\n',
}

// SleepInit returns a static x86-64 ELF executable that writes SleepMarker and then sleeps
// until a signal, for ever: as PID 1 it is the idle guest with nothing of nexus in it, the
// baseline of what an idle sandbox costs the host. Run outside a VM it waits for a signal too.
func SleepInit() []byte { return staticELF(sleepCode) }

// staticELF wraps x86-64 code, entered at its first byte, in a one-segment static executable.
func staticELF(code []byte) []byte {
	const (
		base     = 0x400000
		ehdrSize = 64
		phdrSize = 56
	)
	total := uint64(ehdrSize + phdrSize + len(code))
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	binary.Write(&b, le, uint16(2))                      // e_type: EXEC
	binary.Write(&b, le, uint16(0x3e))                   // e_machine: x86-64
	binary.Write(&b, le, uint32(1))                      // e_version
	binary.Write(&b, le, uint64(base+ehdrSize+phdrSize)) // e_entry
	binary.Write(&b, le, uint64(ehdrSize))               // e_phoff
	binary.Write(&b, le, uint64(0))                      // e_shoff
	binary.Write(&b, le, uint32(0))                      // e_flags
	binary.Write(&b, le, uint16(ehdrSize))               // e_ehsize
	binary.Write(&b, le, uint16(phdrSize))               // e_phentsize
	binary.Write(&b, le, uint16(1))                      // e_phnum
	binary.Write(&b, le, uint16(0))                      // e_shentsize
	binary.Write(&b, le, uint16(0))                      // e_shnum
	binary.Write(&b, le, uint16(0))                      // e_shstrndx
	binary.Write(&b, le, uint32(1))                      // p_type: LOAD
	binary.Write(&b, le, uint32(5))                      // p_flags: R+X
	binary.Write(&b, le, uint64(0))                      // p_offset
	binary.Write(&b, le, uint64(base))                   // p_vaddr
	binary.Write(&b, le, uint64(base))                   // p_paddr
	binary.Write(&b, le, total)                          // p_filesz
	binary.Write(&b, le, total)                          // p_memsz
	binary.Write(&b, le, uint64(0x1000))                 // p_align
	b.Write(code)
	return b.Bytes()
}
