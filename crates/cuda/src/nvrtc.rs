//! NVRTC, loaded at run time: CUDA C source to PTX for a given virtual architecture, no CUDA
//! toolkit needed to build agentkv. Owns the compile call and its log; it never loads PTX
//! onto a device (that is the driver's, [`crate::Gpu`]).

use std::ffi::{c_char, c_int, CStr, CString};
use std::ptr;

use libloading::Library;

use crate::error::CudaError;
use crate::library::{self, symbol};

type Program = *mut std::ffi::c_void;
type Status = c_int;

#[derive(Clone, Copy)]
struct Fns {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

/// An opened NVRTC.
pub struct Nvrtc {
    fns: Fns,
    path: String,
    _lib: Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc").field("path", &self.path).finish()
    }
}

impl Nvrtc {
    /// Opens NVRTC (`AGENTKV_LIBNVRTC`, else the loader's search path).
    pub fn load() -> Result<Nvrtc, CudaError> {
        let (lib, path) = library::open(&library::NVRTC)?;
        // SAFETY: each type below is the C signature of that function in nvrtc.h (CUDA 11–13:
        // nvrtcResult is a C enum, nvrtcProgram a pointer, sizes are size_t).
        let fns = unsafe {
            Fns {
                version: symbol(&lib, &path, "nvrtcVersion\0")?,
                create: symbol(&lib, &path, "nvrtcCreateProgram\0")?,
                compile: symbol(&lib, &path, "nvrtcCompileProgram\0")?,
                log_size: symbol(&lib, &path, "nvrtcGetProgramLogSize\0")?,
                log: symbol(&lib, &path, "nvrtcGetProgramLog\0")?,
                ptx_size: symbol(&lib, &path, "nvrtcGetPTXSize\0")?,
                ptx: symbol(&lib, &path, "nvrtcGetPTX\0")?,
                destroy: symbol(&lib, &path, "nvrtcDestroyProgram\0")?,
                error_string: symbol(&lib, &path, "nvrtcGetErrorString\0")?,
            }
        };
        Ok(Nvrtc {
            fns,
            path,
            _lib: lib,
        })
    }

    /// The file it was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// NVRTC's (major, minor) version.
    pub fn version(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers, as nvrtcVersion takes.
        unsafe { (self.fns.version)(&mut major, &mut minor) };
        (major, minor)
    }

    fn message(&self, status: Status) -> String {
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any status.
        let text = unsafe { (self.fns.error_string)(status) };
        if text.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, static and NUL-terminated (above).
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// Compiles `source` (named `name` in messages) to PTX for `arch` (e.g. `compute_90`),
    /// without fast math (IEEE division and square roots; contraction to FMA allowed).
    pub fn compile(&self, name: &str, source: &str, arch: &str) -> Result<String, CudaError> {
        let fail = |message: String, log: String| CudaError::Compile {
            source_name: name.to_string(),
            message,
            log,
        };
        let c_source = CString::new(source).map_err(|_| fail("NUL in source".into(), "".into()))?;
        let c_name = CString::new(name).map_err(|_| fail("NUL in name".into(), "".into()))?;
        let options: Vec<CString> = [
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
            "--fmad=true".to_string(),
        ]
        .into_iter()
        .map(|o| CString::new(o).expect("options hold no NUL"))
        .collect();
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = ptr::null_mut();
        // SAFETY: valid NUL-terminated source and name; zero headers with null arrays, as
        // nvrtcCreateProgram allows.
        let status = unsafe {
            (self.fns.create)(
                &mut program,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                ptr::null(),
                ptr::null(),
            )
        };
        if status != 0 {
            return Err(fail(self.message(status), String::new()));
        }
        let result = self.compile_program(program, &option_ptrs);
        // SAFETY: `program` was created above and is destroyed once.
        unsafe { (self.fns.destroy)(&mut program) };
        result.map_err(|(message, log)| fail(message, log))
    }

    fn compile_program(
        &self,
        program: Program,
        options: &[*const c_char],
    ) -> Result<String, (String, String)> {
        // SAFETY: `program` is live; `options` are valid C strings that outlive the call.
        let status =
            unsafe { (self.fns.compile)(program, options.len() as c_int, options.as_ptr()) };
        if status != 0 {
            return Err((self.message(status), self.read(program, true)));
        }
        Ok(self.read(program, false))
    }

    /// The program's log (`log`) or PTX, without the trailing NUL.
    fn read(&self, program: Program, log: bool) -> String {
        let mut size = 0usize;
        // SAFETY: `program` is live and `size` a valid out-pointer.
        let status = unsafe {
            if log {
                (self.fns.log_size)(program, &mut size)
            } else {
                (self.fns.ptx_size)(program, &mut size)
            }
        };
        if status != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC just said it writes.
        unsafe {
            if log {
                (self.fns.log)(program, buf.as_mut_ptr().cast())
            } else {
                (self.fns.ptx)(program, buf.as_mut_ptr().cast())
            }
        };
        while buf.last() == Some(&0) {
            buf.pop();
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}
