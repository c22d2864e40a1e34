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
