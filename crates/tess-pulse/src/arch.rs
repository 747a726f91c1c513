//! The machine-level part of Pulse, x86_64 only: the context switch, the entry of a fresh
//! context, the preemption trampoline, and the per-kernel-thread pointer to the hart.
//!
//! # Why hand-written assembly
//!
//! A cooperative switch saves only what the System V ABI says a callee keeps (`rbx`, `rbp`,
//! `r12`-`r15`, `rsp`, the MXCSR and x87 control words): 6 pushes and two control-word stores,
//! a stack swap, two control-word loads and 7 pops, a few nanoseconds. A preempted context
//! must keep everything (all 16 general registers, the flags, the whole extended state with
//! `xsave`), so preemption goes through a separate trampoline ([`pulse_preempt_entry`]) that
//! saves everything on the thread's own stack and then uses the same cooperative switch. A
//! suspended context is therefore always just a stack pointer: the top of its stack holds what
//! the switch needs to resume it.
//!
//! # Switching
//!
//! [`pulse_switch`] saves the calling context and resumes another; [`pulse_resume`] only
//! resumes, for a caller that is never resumed itself: the scheduler activation that hands the
//! hart to a thread (a fresh activation is made for every scheduler entry, see `hart.rs`), and
//! a hart leaving for its base context. That is half the saving work of a yield, which is one
//! switch into the scheduler and one resume out of it. The saving is mostly `stmxcsr`, the
//! dearest instruction of a switch: about 5 ns on the test machine (AMD EPYC guest), where
//! `ldmxcsr`, `fnstcw` and `fldcw` take about 1 ns each. The control words (the MXCSR and the
//! x87 control word, callee-saved by the ABI, so a thread's rounding modes stay its own) are
//! always reloaded on the way in: cheap, and the scheduler then always runs with the defaults a
//! fresh activation carries.
//!
//! The switch ends with `pop rcx; jmp rcx` where a function would `ret`. A `ret` is predicted
//! by the CPU's return stack buffer, which holds the return addresses of the calls made on the
//! *current* stack; the switch's own `ret`, right after the stack swap, was predicted wrong
//! every time, twice a yield (into the scheduler, out of it). The indirect jump is predicted by
//! the branch target buffer from its history instead. (The buffer stays out of step with the
//! resumed stack, so the resumed code's next returns may still miss; only the switch's own
//! misprediction is gone.) Measured on the test machine with both changes of this section, a
//! tight loop of two threads yielding 20 million times went from about 46 ns a yield to about
//! 33 ns, nearly all of it from the jump (`pulse_resume` alone was within the noise), and
//! `coop_switch_ns` in `tess bench pulse` from about 55 ns to about 26 ns (medians of six
//! interleaved `--quick` runs of each build).
//!
//! # The immune range
//!
//! All routines here lie between `pulse_asm_begin` and `pulse_asm_end`. The tick handler never
//! preempts code in that range (it marks the tick pending instead, see `tick.rs`). That makes
//! each routine atomic with respect to ticks: for instance [`pulse_ticks_off`] reads the hart
//! pointer and clears its flag with no window in which the thread could be preempted and moved
//! to another hart between the two (the paper gets the same from a single `%fs`-relative store,
//! section 4.3).
//!
//! # The hart pointer
//!
//! `pulse_tls_hart` is a thread-local word defined here and read with the initial-exec model
//! (`fs:[GOTTPOFF]`). Rust's `thread_local!` is not used for it on purpose: the compiler may keep
//! a thread-local's address in a register across a call, which is wrong once a user-level thread
//! can resume on another kernel thread; an out-of-line assembly read cannot be cached.

use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(not(target_arch = "x86_64"))]
compile_error!("tess-pulse implements its context switch for x86_64 only");

std::arch::global_asm!(
    r#"
    .section .tbss,"awT",@nobits
    .p2align 3
    .type pulse_tls_hart, @object
    .size pulse_tls_hart, 8
pulse_tls_hart:
    .zero 8

    .text
    .p2align 4
    .globl pulse_asm_begin
    .hidden pulse_asm_begin
pulse_asm_begin:

    // void pulse_switch(void **save_sp, void *to_sp, uint32_t *ticks_flag, uint32_t enable)
    .p2align 4
    .globl pulse_switch
    .hidden pulse_switch
pulse_switch:
    push rbp
    push rbx
    push r12
    push r13
    push r14
    push r15
    sub rsp, 8
    stmxcsr [rsp]
    fnstcw [rsp + 4]
    mov [rdi], rsp
    mov rdi, rsi
    mov rsi, rdx
    mov edx, ecx
    // Falls through: the rest is pulse_resume(to_sp, ticks_flag, enable).

    // void pulse_resume(void *to_sp, uint32_t *ticks_flag, uint32_t enable): switches to
    // to_sp without saving the current context, which is abandoned (module docs, "Switching").
    .globl pulse_resume
    .hidden pulse_resume
pulse_resume:
    mov rsp, rdi
    mov dword ptr [rsi], edx
    ldmxcsr [rsp]
    fldcw [rsp + 4]
    add rsp, 8
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbx
    pop rbp
    // Not `ret` (module docs, "Switching"); rcx is free, the resumed code expects a call's
    // clobbers.
    pop rcx
    jmp rcx

    // First instruction of a fresh context: call r12(r13, r14); never returns.
    .p2align 4
    .globl pulse_ctx_entry
    .hidden pulse_ctx_entry
pulse_ctx_entry:
    mov rdi, r13
    mov rsi, r14
    call r12
    ud2

    // void *pulse_current_hart(void)
    .p2align 4
    .globl pulse_current_hart
    .hidden pulse_current_hart
pulse_current_hart:
    mov rax, qword ptr [rip + pulse_tls_hart@GOTTPOFF]
    mov rax, qword ptr fs:[rax]
    ret

    // void pulse_set_current_hart(void *hart)
    .p2align 4
    .globl pulse_set_current_hart
    .hidden pulse_set_current_hart
pulse_set_current_hart:
    mov rax, qword ptr [rip + pulse_tls_hart@GOTTPOFF]
    mov qword ptr fs:[rax], rdi
    ret

    // void *pulse_ticks_off(void): clears the hart's TICKS_ENABLED word (offset 0), returns the
    // hart (NULL outside a hart).
    .p2align 4
    .globl pulse_ticks_off
    .hidden pulse_ticks_off
pulse_ticks_off:
    mov rax, qword ptr [rip + pulse_tls_hart@GOTTPOFF]
    mov rax, qword ptr fs:[rax]
    test rax, rax
    jz 2f
    mov dword ptr [rax], 0
2:
    ret

    // uint32_t pulse_ticks_on(void): sets TICKS_ENABLED, returns and clears the pending word
    // (offset 4): a tick that came while ticks were off.
    .p2align 4
    .globl pulse_ticks_on
    .hidden pulse_ticks_on
pulse_ticks_on:
    mov rax, qword ptr [rip + pulse_tls_hart@GOTTPOFF]
    mov rcx, qword ptr fs:[rax]
    xor eax, eax
    test rcx, rcx
    jz 2f
    mov dword ptr [rcx], 1
    xchg eax, dword ptr [rcx + 4]
2:
    ret

    // The tick handler sends a preempted thread here: [rsp] is the interrupted rip, and rsp is
    // the interrupted rsp minus 136 (the 128-byte red zone and that return address).
    .p2align 4
    .globl pulse_preempt_entry
    .hidden pulse_preempt_entry
pulse_preempt_entry:
    pushfq
    push rax
    push rcx
    push rdx
    push rsi
    push rdi
    push r8
    push r9
    push r10
    push r11
    push rbx
    push rbp
    push r12
    push r13
    push r14
    push r15
    mov rbx, rsp
    sub rsp, qword ptr [rip + {xsave_size}]
    and rsp, -64
    xor eax, eax
    mov [rsp + 512], rax
    mov [rsp + 520], rax
    mov [rsp + 528], rax
    mov [rsp + 536], rax
    mov [rsp + 544], rax
    mov [rsp + 552], rax
    mov [rsp + 560], rax
    mov [rsp + 568], rax
    mov eax, -1
    mov edx, -1
    xsave64 [rsp]
    call {prepare}
    mov rdi, rax
    mov rsi, rdx
    mov rax, qword ptr [rip + pulse_tls_hart@GOTTPOFF]
    mov rdx, qword ptr fs:[rax]
    xor ecx, ecx
    call pulse_switch
    mov eax, -1
    mov edx, -1
    xrstor64 [rsp]
    mov rsp, rbx
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbp
    pop rbx
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rax
    popfq
    ret 128

    .globl pulse_asm_end
    .hidden pulse_asm_end
pulse_asm_end:
    nop
"#,
    xsave_size = sym XSAVE_SIZE,
    prepare = sym crate::hart::pulse_preempt_prepare,
);

extern "C" {
    fn pulse_asm_begin();
    fn pulse_asm_end();
    fn pulse_ctx_entry();
    fn pulse_preempt_entry();
    /// Saves the callee-saved state on the current stack, stores the stack pointer in
    /// `*save_sp`, stores `enable` into `*ticks_flag`, and resumes the context at `to_sp`.
    pub(crate) fn pulse_switch(save_sp: *mut *mut u8, to_sp: *mut u8, ticks: *mut u32, enable: u32);
    /// Like `pulse_switch`, but the calling context is abandoned, not saved; never returns.
    pub(crate) fn pulse_resume(to_sp: *mut u8, ticks: *mut u32, enable: u32) -> !;
    #[link_name = "pulse_current_hart"]
    fn raw_current_hart() -> *mut libc::c_void;
    #[link_name = "pulse_set_current_hart"]
    fn raw_set_current_hart(h: *mut libc::c_void);
    #[link_name = "pulse_ticks_off"]
    fn raw_ticks_off() -> *mut libc::c_void;
    /// Sets TICKS_ENABLED; returns 1 if a tick arrived while they were off.
    pub(crate) fn pulse_ticks_on() -> u32;
}

/// The calling kernel thread's hart, or null.
///
/// # Safety
/// Always safe to call; `unsafe` because the pointer's validity is the caller's to judge.
pub(crate) unsafe fn pulse_current_hart() -> *mut crate::hart::HartState {
    // SAFETY: reads this kernel thread's TLS word.
    unsafe { raw_current_hart().cast() }
}

/// Sets the calling kernel thread's hart.
///
/// # Safety
/// `h` is null or a HartState that outlives its use by this kernel thread.
pub(crate) unsafe fn pulse_set_current_hart(h: *mut crate::hart::HartState) {
    // SAFETY: writes this kernel thread's TLS word.
    unsafe { raw_set_current_hart(h.cast()) }
}

/// Clears TICKS_ENABLED of the calling kernel thread's hart; returns the hart (or null).
///
/// # Safety
/// Always safe to call; `unsafe` because ticks stay off until the caller turns them on.
pub(crate) unsafe fn pulse_ticks_off() -> *mut crate::hart::HartState {
    // SAFETY: touches only this kernel thread's hart.
    unsafe { raw_ticks_off().cast() }
}

/// Bytes the preemption trampoline reserves for `xsave` (from CPUID leaf 0xD), plus alignment.
static mut XSAVE_SIZE: u64 = 4096;

/// Reads the extended-state size once; call before the first tick can fire.
pub(crate) fn init_xsave() {
    // CPUID leaf 1 (OSXSAVE) and leaf 0xD (extended state size) are read-only queries.
    let l1 = std::arch::x86_64::__cpuid(1);
    let has_xsave = l1.ecx & (1 << 27) != 0;
    let size = std::arch::x86_64::__cpuid_count(0xD, 0).ebx as u64;
    assert!(
        has_xsave,
        "tess-pulse: this CPU or kernel does not enable XSAVE, which preemption needs"
    );
    // SAFETY: written before any hart exists (every caller is Pulse's start-up, which runs
    // before a timer is armed) and only read by the trampoline afterwards; the value is the
    // same on every call.
    unsafe {
        std::ptr::addr_of_mut!(XSAVE_SIZE).write_volatile(size.max(576) + 64);
    }
}

/// Whether `rip` is inside Pulse's assembly (never preempted there).
pub(crate) fn in_immune_range(rip: usize) -> bool {
    let begin = pulse_asm_begin as *const () as usize;
    let end = pulse_asm_end as *const () as usize;
    rip >= begin && rip < end
}

/// The address the tick handler redirects a preempted thread to.
pub(crate) fn preempt_entry() -> usize {
    pulse_preempt_entry as *const () as usize
}

/// Bytes a saved cooperative context occupies at the top of its stack.
const FRAME_WORDS: usize = 8;

/// Default MXCSR (all exceptions masked) and x87 control word, for fresh contexts.
const FRESH_CONTROL_WORDS: u64 = 0x1F80 | (0x037F << 32);

/// Prepares a fresh context on the stack whose highest usable address is `top`: resuming it
/// calls `entry(arg0, arg1)` on that stack. Returns the stack pointer to resume.
///
/// # Safety
/// `top` must be the end of at least 128 writable bytes that nothing else uses, and `entry`
/// must never return (it ends by switching away).
pub(crate) unsafe fn make_context(
    top: *mut u8,
    entry: unsafe extern "C" fn(usize, usize) -> !,
    arg0: usize,
    arg1: usize,
) -> *mut u8 {
    let top = (top as usize) & !15;
    // Layout from the returned sp upward: control words, r15, r14, r13, r12, rbx, rbp, return
    // address (pulse_ctx_entry); above it a zero word as a fake return address for debuggers.
    // After the switch's last `pop rcx`, rsp = top - 16, which is 16-byte aligned for the `call`
    // in pulse_ctx_entry.
    let ret_slot = top - 24;
    let sp = ret_slot - (FRAME_WORDS - 1) * 8;
    let words = sp as *mut u64;
    let values: [u64; FRAME_WORDS + 2] = [
        FRESH_CONTROL_WORDS,
        0,                     // r15
        arg1 as u64,           // r14
        arg0 as u64,           // r13
        entry as usize as u64, // r12
        0,                     // rbx
        0,                     // rbp
        pulse_ctx_entry as *const () as usize as u64,
        0,
        0,
    ];
    for (i, v) in values.iter().enumerate() {
        // SAFETY: the caller guarantees [top-128, top) is ours; we write sp..top, 80 bytes.
        unsafe { words.add(i).write(*v) };
    }
    sp as *mut u8
}

/// Counts how often the immune range was hit (diagnostics only).
pub(crate) static IMMUNE_HITS: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn note_immune_hit() {
    IMMUNE_HITS.fetch_add(1, Ordering::Relaxed);
}
