//! A minimal H.264 decoder on FFmpeg's libavcodec, loaded at run time with `dlopen`.
//!
//! Debian ships the run-time libraries (`libavcodec59`, `libavutil57`, pulled in by `ffmpeg`)
//! but not the headers, so the few functions the bench needs are declared here by hand, from
//! FFmpeg 5.1's public headers (`libavcodec/avcodec.h`, `libavcodec/packet.h`,
//! `libavutil/opt.h`, `libavutil/frame.h`). Everything else stays opaque. `dlopen`/`dlsym`
//! come from libc, so the bench adds no crate to the workspace.
//!
//! The one struct whose fields we touch is `AVPacket`: in FFmpeg 5.1 (libavcodec 59) it starts
//! with `AVBufferRef *buf; int64_t pts; int64_t dts; uint8_t *data; int size; ...` (checked
//! against `packet.h` of libavcodec-dev 5.1). [`PacketPrefix`] mirrors that prefix; the packet
//! itself is allocated by `av_packet_alloc`, so its full size never matters here. A packet with
//! `buf == NULL` is not reference counted, and `avcodec_send_packet` copies its data.

use std::ffi::{c_char, c_int, c_void, CStr};

/// `AV_CODEC_ID_H264` (libavcodec/codec_id.h: the 28th entry after NONE).
const AV_CODEC_ID_H264: c_int = 27;
/// `AVERROR(EAGAIN)`.
const AVERROR_EAGAIN: c_int = -libc::EAGAIN;
/// `AVERROR_EOF` = `FFERRTAG('E','O','F',' ')`.
const AVERROR_EOF: c_int = -(0x45 | (0x4f << 8) | (0x46 << 16) | (0x20 << 24));

/// The prefix of FFmpeg 5.1's `AVPacket` up to `size` (module docs).
#[repr(C)]
struct PacketPrefix {
    buf: *mut c_void,
    pts: i64,
    dts: i64,
    data: *mut u8,
    size: c_int,
}

type FindDecoder = unsafe extern "C" fn(c_int) -> *const c_void;
type AllocContext = unsafe extern "C" fn(*const c_void) -> *mut c_void;
type Open2 = unsafe extern "C" fn(*mut c_void, *const c_void, *mut *mut c_void) -> c_int;
type FreeContext = unsafe extern "C" fn(*mut *mut c_void);
type PacketAlloc = unsafe extern "C" fn() -> *mut PacketPrefix;
type PacketFree = unsafe extern "C" fn(*mut *mut PacketPrefix);
type FrameAlloc = unsafe extern "C" fn() -> *mut c_void;
type FrameFree = unsafe extern "C" fn(*mut *mut c_void);
type SendPacket = unsafe extern "C" fn(*mut c_void, *const PacketPrefix) -> c_int;
type ReceiveFrame = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type OptSetInt = unsafe extern "C" fn(*mut c_void, *const c_char, i64, c_int) -> c_int;

/// The functions of libavcodec 59 and libavutil 57 the bench calls.
pub struct Lib {
    find_decoder: FindDecoder,
    alloc_context: AllocContext,
    open2: Open2,
    free_context: FreeContext,
    packet_alloc: PacketAlloc,
    packet_free: PacketFree,
    frame_alloc: FrameAlloc,
    frame_free: FrameFree,
    send_packet: SendPacket,
    receive_frame: ReceiveFrame,
    opt_set_int: OptSetInt,
}

fn open_lib(name: &CStr) -> anyhow::Result<*mut c_void> {
    // SAFETY: name is NUL-terminated; dlopen has no other precondition. The handle is never
    // closed, so symbols taken from it stay valid for the life of the process.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next call.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            String::new()
        } else {
            // SAFETY: non-NULL, NUL-terminated (above).
            unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        };
        anyhow::bail!(
            "cannot load {} ({why}): install Debian's libavcodec59 and libavutil57 \
             (`apt-get install libavcodec59`, or ffmpeg, which scripts/setup installs)",
            name.to_string_lossy()
        );
    }
    Ok(h)
}

fn sym(h: *mut c_void, name: &CStr) -> anyhow::Result<*mut c_void> {
    // SAFETY: h is a live handle from dlopen (never closed), name is NUL-terminated.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    anyhow::ensure!(
        !p.is_null(),
        "libavcodec/libavutil lacks {} (FFmpeg 5.1 expected)",
        name.to_string_lossy()
    );
    Ok(p)
}

macro_rules! load {
    ($h:expr, $name:literal, $ty:ty) => {{
        let p = sym($h, $name)?;
        // SAFETY: p is the address of the exported function $name, whose C prototype in FFmpeg
        // 5.1's headers is the one $ty spells (module docs); function and data pointers have
        // the same size on the platforms FFmpeg supports.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

impl Lib {
    /// Loads libavcodec.so.59 and libavutil.so.57, or says which package to install.
    pub fn load() -> anyhow::Result<Lib> {
        let util = open_lib(c"libavutil.so.57")?;
        let codec = open_lib(c"libavcodec.so.59")?;
        Ok(Lib {
            find_decoder: load!(codec, c"avcodec_find_decoder", FindDecoder),
            alloc_context: load!(codec, c"avcodec_alloc_context3", AllocContext),
            open2: load!(codec, c"avcodec_open2", Open2),
            free_context: load!(codec, c"avcodec_free_context", FreeContext),
            packet_alloc: load!(codec, c"av_packet_alloc", PacketAlloc),
            packet_free: load!(codec, c"av_packet_free", PacketFree),
            frame_alloc: load!(util, c"av_frame_alloc", FrameAlloc),
            frame_free: load!(util, c"av_frame_free", FrameFree),
            send_packet: load!(codec, c"avcodec_send_packet", SendPacket),
            receive_frame: load!(codec, c"avcodec_receive_frame", ReceiveFrame),
            opt_set_int: load!(util, c"av_opt_set_int", OptSetInt),
        })
    }

    /// A single-threaded H.264 decoder.
    pub fn decoder(&'static self) -> anyhow::Result<Decoder> {
        // SAFETY: plain constructor calls; every result is checked before use, and whatever
        // was allocated is owned by the returned Decoder (freed in Drop) or freed here.
        unsafe {
            let codec = (self.find_decoder)(AV_CODEC_ID_H264);
            anyhow::ensure!(!codec.is_null(), "libavcodec has no H.264 decoder");
            let ctx = (self.alloc_context)(codec);
            anyhow::ensure!(!ctx.is_null(), "avcodec_alloc_context3 failed");
            let d = Decoder {
                lib: self,
                ctx,
                pkt: (self.packet_alloc)(),
                frame: (self.frame_alloc)(),
            };
            anyhow::ensure!(
                !d.pkt.is_null() && !d.frame.is_null(),
                "av_packet_alloc/av_frame_alloc failed"
            );
            // One decoding thread per stream, as in the paper ("one thread per video").
            // AV_OPT_SEARCH_CHILDREN = 1 is not needed: "threads" is an AVCodecContext option.
            let r = (self.opt_set_int)(d.ctx, c"threads".as_ptr(), 1, 0);
            anyhow::ensure!(r >= 0, "av_opt_set_int(threads) failed ({r})");
            let r = (self.open2)(d.ctx, codec, std::ptr::null_mut());
            anyhow::ensure!(r >= 0, "avcodec_open2 failed ({r})");
            Ok(d)
        }
    }
}

/// One open decoder: a codec context, a packet and a frame.
pub struct Decoder {
    lib: &'static Lib,
    ctx: *mut c_void,
    pkt: *mut PacketPrefix,
    frame: *mut c_void,
}

// SAFETY: a Decoder is used by one thread at a time (it moves into the thread that decodes);
// libavcodec contexts have no thread affinity.
unsafe impl Send for Decoder {}

impl Decoder {
    /// Decodes one access unit; returns the number of frames it produced.
    pub fn decode(&mut self, au: &[u8]) -> anyhow::Result<usize> {
        let size = c_int::try_from(au.len())?;
        // SAFETY: pkt, ctx and frame are live and exclusively ours (&mut self). The packet
        // borrows `au` only for the duration of avcodec_send_packet, which copies the data of a
        // packet without `buf`; data/size are reset before returning.
        unsafe {
            (*self.pkt).buf = std::ptr::null_mut();
            (*self.pkt).data = au.as_ptr() as *mut u8;
            (*self.pkt).size = size;
            let r = (self.lib.send_packet)(self.ctx, self.pkt);
            (*self.pkt).data = std::ptr::null_mut();
            (*self.pkt).size = 0;
            anyhow::ensure!(r >= 0, "avcodec_send_packet failed ({r})");
            let mut frames = 0;
            loop {
                let r = (self.lib.receive_frame)(self.ctx, self.frame);
                if r == AVERROR_EAGAIN || r == AVERROR_EOF {
                    return Ok(frames);
                }
                anyhow::ensure!(r >= 0, "avcodec_receive_frame failed ({r})");
                frames += 1;
            }
        }
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: the pointers came from the matching allocators and are freed once; the free
        // functions accept pointers to NULL.
        unsafe {
            (self.lib.frame_free)(&mut self.frame);
            (self.lib.packet_free)(&mut self.pkt);
            (self.lib.free_context)(&mut self.ctx);
        }
    }
}
