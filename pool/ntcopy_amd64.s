#include "textflag.h"

// func copyNonTemporal(dst, src *byte, n uintptr)
// Copies n bytes (a multiple of 64) with streaming stores: the destination lines are
// written without first being read into the cache. dst must be 16-byte aligned.
TEXT ·copyNonTemporal(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	SHRQ	$6, CX
	JZ	done
loop:
	MOVOU	0(SI), X0
	MOVOU	16(SI), X1
	MOVOU	32(SI), X2
	MOVOU	48(SI), X3
	MOVNTO	X0, 0(DI)
	MOVNTO	X1, 16(DI)
	MOVNTO	X2, 32(DI)
	MOVNTO	X3, 48(DI)
	ADDQ	$64, SI
	ADDQ	$64, DI
	DECQ	CX
	JNZ	loop
done:
	RET

// func storeFence()
TEXT ·storeFence(SB), NOSPLIT, $0-0
	SFENCE
	RET

// func copyNonTemporalPrefetch(dst, src *byte, n uintptr, pf uintptr, pfn uintptr)
// copyNonTemporal that also prefetches pfn bytes from pf, one line per line copied:
// the caller names the source it reads next, which a hardware prefetcher cannot
// guess when the next run starts far from this one.
TEXT ·copyNonTemporalPrefetch(SB), NOSPLIT, $0-40
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	MOVQ	pf+24(FP), R8
	MOVQ	pfn+32(FP), R9
	SHRQ	$6, CX
	JZ	pfdone
pfloop:
	TESTQ	R9, R9
	JZ	pfcopy
	PREFETCHT0	(R8)
	ADDQ	$64, R8
	SUBQ	$64, R9
	JAE	pfcopy
	XORQ	R9, R9
pfcopy:
	MOVOU	0(SI), X0
	MOVOU	16(SI), X1
	MOVOU	32(SI), X2
	MOVOU	48(SI), X3
	MOVNTO	X0, 0(DI)
	MOVNTO	X1, 16(DI)
	MOVNTO	X2, 32(DI)
	MOVNTO	X3, 48(DI)
	ADDQ	$64, SI
	ADDQ	$64, DI
	DECQ	CX
	JNZ	pfloop
pfdone:
	RET

// func copyRunsAVX(dst *byte, dstep uintptr, src *byte, sstep uintptr, run uintptr, count uintptr, pf uintptr)
// Copies count runs of run bytes (a multiple of 128), the i-th from src+i*sstep to
// dst+i*dstep, with 32-byte loads and streaming stores, and prefetches the two
// source lines pf bytes ahead of each 128 bytes it loads (PREFETCHNTA, into the
// nearest cache only). pf names where the copy reads later: a few hundred bytes
// for runs that lie end to end (the runtime's own large memmove prefetches 448 and
// 640 bytes ahead), the same layer some tokens later for runs at a stride. Every
// dst+i*dstep must be 32-byte aligned.
TEXT ·copyRunsAVX(SB), NOSPLIT, $0-56
	MOVQ	dst+0(FP), DI
	MOVQ	dstep+8(FP), R8
	MOVQ	src+16(FP), SI
	MOVQ	sstep+24(FP), R9
	MOVQ	run+32(FP), R10
	MOVQ	count+40(FP), R11
	MOVQ	pf+48(FP), R12
	SHRQ	$7, R10
	JZ	runsdone
	TESTQ	R11, R11
	JZ	runsdone
runsnext:
	MOVQ	DI, AX
	MOVQ	SI, BX
	MOVQ	R10, CX
runsloop:
	PREFETCHNTA	(BX)(R12*1)
	PREFETCHNTA	64(BX)(R12*1)
	VMOVDQU	0(BX), Y0
	VMOVDQU	32(BX), Y1
	VMOVDQU	64(BX), Y2
	VMOVDQU	96(BX), Y3
	VMOVNTDQ	Y0, 0(AX)
	VMOVNTDQ	Y1, 32(AX)
	VMOVNTDQ	Y2, 64(AX)
	VMOVNTDQ	Y3, 96(AX)
	ADDQ	$128, BX
	ADDQ	$128, AX
	DECQ	CX
	JNZ	runsloop
	ADDQ	R8, DI
	ADDQ	R9, SI
	DECQ	R11
	JNZ	runsnext
	VZEROUPPER
runsdone:
	RET

// func touchLines(p *byte, n uintptr)
// Loads one word of every 64-byte line of the n bytes at p and discards it. A copy
// that skips part of a sequential source (the layers another job copied) reads the
// skipped lines this way, so that the CPU sees one unbroken stream and its hardware
// prefetchers keep running ahead (on a 2-core AMD EPYC a tail copy of 31 of 32
// layers that skips layer 0 ran at 0.65-0.78x of memcpy, one that reads it at
// 0.90-0.96x).
TEXT ·touchLines(SB), NOSPLIT, $0-16
	MOVQ	p+0(FP), SI
	MOVQ	n+8(FP), CX
	ADDQ	$63, CX
	SHRQ	$6, CX
	JZ	touchdone
touchloop:
	MOVQ	0(SI), AX
	ADDQ	$64, SI
	DECQ	CX
	JNZ	touchloop
touchdone:
	RET
