//! The CUDA driver API, loaded at run time: one device's primary context, device memory,
//! modules from PTX and kernel launches checked against [`crate::kernels::KERNELS`].
//!
//! Owns every driver call. It never compiles (NVRTC, [`crate::Nvrtc`]) and holds no model
//! state: what to allocate and launch is its callers'.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::marker::PhantomData;
use std::sync::Arc;

use libloading::Library;

use crate::error::CudaError;
use crate::kernels::{self, ArgKind};
use crate::library::{self, symbol};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuModule = *mut c_void;
type CuFunction = *mut c_void;
type CuDevicePtr = u64;

const ATTR_MULTIPROCESSORS: c_int = 16;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;

#[derive(Clone, Copy)]
struct Fns {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    device_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    device_total_mem: unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult,
    primary_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    synchronize: unsafe extern "C" fn() -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut CuModule, *const c_void) -> CuResult,
    module_function: unsafe extern "C" fn(*mut CuFunction, CuModule, *const c_char) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    dtod: unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize) -> CuResult,
    launch: unsafe extern "C" fn(
        CuFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

/// The opened driver library.
struct Driver {
    fns: Fns,
    _lib: Library,
}

impl Driver {
    fn load() -> Result<Driver, CudaError> {
        let (lib, path) = library::open(&library::DRIVER)?;
        // SAFETY: each type is the C signature of that function in cuda.h (the `_v2` entry
        // points are the 64-bit ones: CUdeviceptr is unsigned long long, sizes size_t).
        let fns = unsafe {
            Fns {
                init: symbol(&lib, &path, "cuInit\0")?,
                driver_version: symbol(&lib, &path, "cuDriverGetVersion\0")?,
                device_count: symbol(&lib, &path, "cuDeviceGetCount\0")?,
                device_get: symbol(&lib, &path, "cuDeviceGet\0")?,
                device_name: symbol(&lib, &path, "cuDeviceGetName\0")?,
                device_attribute: symbol(&lib, &path, "cuDeviceGetAttribute\0")?,
                device_total_mem: symbol(&lib, &path, "cuDeviceTotalMem_v2\0")?,
                primary_retain: symbol(&lib, &path, "cuDevicePrimaryCtxRetain\0")?,
                primary_release: symbol(&lib, &path, "cuDevicePrimaryCtxRelease_v2\0")?,
                set_current: symbol(&lib, &path, "cuCtxSetCurrent\0")?,
                synchronize: symbol(&lib, &path, "cuCtxSynchronize\0")?,
                module_load_data: symbol(&lib, &path, "cuModuleLoadData\0")?,
                module_function: symbol(&lib, &path, "cuModuleGetFunction\0")?,
                mem_alloc: symbol(&lib, &path, "cuMemAlloc_v2\0")?,
                mem_free: symbol(&lib, &path, "cuMemFree_v2\0")?,
                htod: symbol(&lib, &path, "cuMemcpyHtoD_v2\0")?,
                dtoh: symbol(&lib, &path, "cuMemcpyDtoH_v2\0")?,
                dtod: symbol(&lib, &path, "cuMemcpyDtoD_v2\0")?,
                launch: symbol(&lib, &path, "cuLaunchKernel\0")?,
                error_name: symbol(&lib, &path, "cuGetErrorName\0")?,
            }
        };
        Ok(Driver { fns, _lib: lib })
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<(), CudaError> {
        if code == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: a valid out-pointer; the driver points it at a static string or leaves it.
        unsafe { (self.fns.error_name)(code, &mut text) };
        let name = if text.is_null() {
            "unknown".to_string()
        } else {
            // SAFETY: non-null, static, NUL-terminated (cuGetErrorName's contract).
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(CudaError::Driver { call, code, name })
    }
}

/// What the driver says of device 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    /// e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub total_memory_bytes: usize,
}

impl DeviceInfo {
    /// NVRTC's virtual architecture for this device (`compute_90` on an H100).
    pub fn arch(&self) -> String {
        format!(
            "compute_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (compute {}.{}, {} SMs, {:.1} GiB, driver CUDA {}.{})",
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.total_memory_bytes as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

struct Context {
    driver: Driver,
    device: CuDevice,
    ctx: CuContext,
}

// SAFETY: a primary context may be made current on any thread (cuCtxSetCurrent); every call
// through `Context` makes it current first, and the driver API is thread-safe.
unsafe impl Send for Context {}
// SAFETY: as above; `Context` has no interior state besides the driver's own.
unsafe impl Sync for Context {}

impl Context {
    fn current(&self) -> Result<&Fns, CudaError> {
        // SAFETY: `ctx` is the retained primary context of `device`, alive until drop.
        let code = unsafe { (self.driver.fns.set_current)(self.ctx) };
        self.driver.check("cuCtxSetCurrent", code)?;
        Ok(&self.driver.fns)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: releases the retain taken in `Gpu::open`, once.
        unsafe { (self.driver.fns.primary_release)(self.device) };
    }
}

/// Device 0's primary context with agentkv's kernels loaded.
pub struct Gpu {
    ctx: Arc<Context>,
    info: DeviceInfo,
    functions: HashMap<&'static str, CuFunction>,
}

// SAFETY: `CuFunction` handles are immutable driver objects valid in any thread once the
// context is current, which every launch makes it.
unsafe impl Send for Gpu {}
// SAFETY: as above.
unsafe impl Sync for Gpu {}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

/// Opens the driver and describes device 0 without creating a context.
pub fn probe() -> Result<DeviceInfo, CudaError> {
    let driver = Driver::load()?;
    describe(&driver).map(|(info, _)| info)
}

fn describe(driver: &Driver) -> Result<(DeviceInfo, CuDevice), CudaError> {
    let f = &driver.fns;
    // SAFETY: every out-pointer below is a valid local; cuInit comes first as the API asks.
    unsafe {
        driver.check("cuInit", (f.init)(0))?;
        let mut version = 0;
        driver.check("cuDriverGetVersion", (f.driver_version)(&mut version))?;
        let mut count = 0;
        driver.check("cuDeviceGetCount", (f.device_count)(&mut count))?;
        if count < 1 {
            return Err(CudaError::NoDevice);
        }
        let mut device = 0;
        driver.check("cuDeviceGet", (f.device_get)(&mut device, 0))?;
        let mut name = [0 as c_char; 256];
        driver.check(
            "cuDeviceGetName",
            (f.device_name)(name.as_mut_ptr(), name.len() as c_int, device),
        )?;
        let attr = |which| -> Result<i32, CudaError> {
            let mut v = 0;
            driver.check(
                "cuDeviceGetAttribute",
                (f.device_attribute)(&mut v, which, device),
            )?;
            Ok(v)
        };
        let cc = (attr(ATTR_CC_MAJOR)?, attr(ATTR_CC_MINOR)?);
        let sms = attr(ATTR_MULTIPROCESSORS)?;
        let mut mem = 0usize;
        driver.check("cuDeviceTotalMem", (f.device_total_mem)(&mut mem, device))?;
        let info = DeviceInfo {
            name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
            driver_version: version,
            compute_capability: cc,
            multiprocessors: sms,
            total_memory_bytes: mem,
        };
        Ok((info, device))
    }
}

impl Gpu {
    /// Device 0 with `ptx` modules loaded (from [`kernels::compile_all`]); every kernel of
    /// [`kernels::KERNELS`] must be found in them.
    pub fn open(ptx: &[(&'static str, String)]) -> Result<Gpu, CudaError> {
        let driver = Driver::load()?;
        let (info, device) = describe(&driver)?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and a device the driver just returned.
        let code = unsafe { (driver.fns.primary_retain)(&mut ctx, device) };
        driver.check("cuDevicePrimaryCtxRetain", code)?;
        let ctx = Arc::new(Context {
            driver,
            device,
            ctx,
        });
        let f = *ctx.current()?;
        let mut functions = HashMap::new();
        for (source, text) in ptx {
            let image = CString::new(text.as_str())
                .map_err(|_| CudaError::Invalid(format!("NUL in the PTX of {source}")))?;
            let mut module: CuModule = std::ptr::null_mut();
            // SAFETY: a NUL-terminated PTX image; the module stays loaded for the context's
            // life (primary contexts unload modules when released).
            let code = unsafe { (f.module_load_data)(&mut module, image.as_ptr().cast()) };
            ctx.driver.check("cuModuleLoadData", code)?;
            for def in kernels::KERNELS.iter().filter(|k| k.source == *source) {
                let name = CString::new(def.name).expect("kernel names hold no NUL");
                let mut func: CuFunction = std::ptr::null_mut();
                // SAFETY: a live module and a NUL-terminated name.
                let code = unsafe { (f.module_function)(&mut func, module, name.as_ptr()) };
                ctx.driver.check("cuModuleGetFunction", code)?;
                functions.insert(def.name, func);
            }
        }
        if let Some(missing) = kernels::KERNELS
            .iter()
            .find(|k| !functions.contains_key(k.name))
        {
            return Err(CudaError::Invalid(format!(
                "kernel {} was not among the loaded modules",
                missing.name
            )));
        }
        Ok(Gpu {
            ctx,
            info,
            functions,
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// A buffer of `len` elements holding whatever bytes the device had there until written.
    pub fn alloc<T: DeviceScalar>(&self, len: usize) -> Result<DeviceBuffer<T>, CudaError> {
        let f = self.ctx.current()?;
        let mut ptr: CuDevicePtr = 0;
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        // SAFETY: valid out-pointer; a positive size.
        let code = unsafe { (f.mem_alloc)(&mut ptr, bytes) };
        self.ctx.driver.check("cuMemAlloc", code)?;
        Ok(DeviceBuffer {
            ctx: self.ctx.clone(),
            ptr,
            len,
            _t: PhantomData,
        })
    }

    /// A buffer holding a copy of `host`.
    pub fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<DeviceBuffer<T>, CudaError> {
        let buf = self.alloc(host.len())?;
        buf.write(host)?;
        Ok(buf)
    }

    /// Waits for every launch and copy issued so far.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let f = self.ctx.current()?;
        // SAFETY: no arguments; the context is current.
        let code = unsafe { (f.synchronize)() };
        self.ctx.driver.check("cuCtxSynchronize", code)
    }

    /// Launches kernel `name` on the default stream with `grid` blocks of `block` threads and
    /// `shared_bytes` of dynamic shared memory. `args` must match the kernel's declared
    /// parameter kinds ([`kernels::KERNELS`]) in number and kind.
    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let def = kernels::kernel(name)?;
        let kinds: Vec<ArgKind> = args.iter().map(Arg::kind).collect();
        if kinds != def.params {
            return Err(CudaError::Invalid(format!(
                "kernel {name} takes {:?}, got {kinds:?}",
                def.params
            )));
        }
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let func = self.functions[def.name];
        // Every argument in its own 8-byte slot, read by the kernel at the slot's start
        // (little-endian: an i32 or f32 is the slot's first four bytes).
        let mut slots: Vec<u64> = args.iter().map(Arg::slot).collect();
        let mut pointers: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect();
        let f = self.ctx.current()?;
        // SAFETY: `func` is a loaded kernel whose parameters are, in order, the kinds `args`
        // were just checked against (pointers 8 bytes, int and float 4); `pointers` holds one
        // valid pointer per parameter into `slots`, both alive across the call (the driver
        // copies the values at launch). Device pointers come from live `DeviceBuffer`s.
        let code = unsafe {
            (f.launch)(
                func,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_bytes,
                std::ptr::null_mut(),
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.ctx.driver.check("cuLaunchKernel", code)
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("kernel argument slots assume a little-endian host");

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    /// A device address, from [`DeviceBuffer::arg`] (or offset from one).
    Ptr(u64),
    I32(i32),
    F32(f32),
}

impl Arg {
    fn kind(&self) -> ArgKind {
        match self {
            Arg::Ptr(_) => ArgKind::Ptr,
            Arg::I32(_) => ArgKind::I32,
            Arg::F32(_) => ArgKind::F32,
        }
    }

    fn slot(&self) -> u64 {
        match *self {
            Arg::Ptr(p) => p,
            Arg::I32(v) => u64::from(v as u32),
            Arg::F32(v) => u64::from(v.to_bits()),
        }
    }
}

/// Element types a [`DeviceBuffer`] holds: plain data, any bit pattern valid.
pub trait DeviceScalar: Copy + Default + Send + Sync + 'static {}
impl DeviceScalar for f32 {}
impl DeviceScalar for i32 {}
impl DeviceScalar for u16 {}
impl DeviceScalar for u8 {}

/// `len` elements of `T` in device memory, freed on drop.
pub struct DeviceBuffer<T: DeviceScalar> {
    ctx: Arc<Context>,
    ptr: CuDevicePtr,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: DeviceScalar> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({} × {})",
            self.len,
            std::any::type_name::<T>()
        )
    }
}

impl<T: DeviceScalar> DeviceBuffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of element `at` (at most `len`; callers check their ranges).
    pub(crate) fn device_ptr_at(&self, at: usize) -> u64 {
        self.ptr + (at.min(self.len) * std::mem::size_of::<T>()) as u64
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The buffer as a kernel argument.
    pub fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }

    /// Element `offset` as a kernel argument (a view into the buffer).
    pub fn arg_at(&self, offset: usize) -> Result<Arg, CudaError> {
        if offset > self.len {
            return Err(CudaError::Invalid(format!(
                "offset {offset} past a buffer of {}",
                self.len
            )));
        }
        Ok(Arg::Ptr(
            self.ptr + (offset * std::mem::size_of::<T>()) as u64,
        ))
    }

    /// Copies `host` (exactly `len` elements) into the buffer (waits for the copy).
    pub fn write(&self, host: &[T]) -> Result<(), CudaError> {
        self.check_len(host.len())?;
        let f = self.ctx.current()?;
        // SAFETY: `host` holds `len` elements of plain data and the buffer as many bytes.
        let code = unsafe { (f.htod)(self.ptr, host.as_ptr().cast(), std::mem::size_of_val(host)) };
        self.ctx.driver.check("cuMemcpyHtoD", code)
    }

    /// Copies the buffer out (after every launch issued before it).
    pub fn read(&self) -> Result<Vec<T>, CudaError> {
        let mut host = vec![T::default(); self.len];
        let f = self.ctx.current()?;
        // SAFETY: `host` has room for `len` elements; any bit pattern is a valid `T`.
        let code = unsafe {
            (f.dtoh)(
                host.as_mut_ptr().cast(),
                self.ptr,
                std::mem::size_of_val(&host[..]),
            )
        };
        self.ctx.driver.check("cuMemcpyDtoH", code)?;
        Ok(host)
    }

    /// Copies `host` into elements `at..at + host.len()` (waits for the copy).
    pub fn write_range(&self, at: usize, host: &[T]) -> Result<(), CudaError> {
        if at + host.len() > self.len {
            return Err(CudaError::Invalid(format!(
                "copy of {} elements at {at} into a buffer of {}",
                host.len(),
                self.len
            )));
        }
        let f = self.ctx.current()?;
        // SAFETY: the range was checked to lie inside the live buffer; `host` is plain data.
        let code = unsafe {
            (f.htod)(
                self.device_ptr_at(at),
                host.as_ptr().cast(),
                std::mem::size_of_val(host),
            )
        };
        self.ctx.driver.check("cuMemcpyHtoD", code)
    }

    /// Elements `at..at + len` copied out (after every launch issued before).
    pub fn read_range(&self, at: usize, len: usize) -> Result<Vec<T>, CudaError> {
        if at + len > self.len {
            return Err(CudaError::Invalid(format!(
                "read of {len} elements at {at} from a buffer of {}",
                self.len
            )));
        }
        let mut host = vec![T::default(); len];
        let f = self.ctx.current()?;
        // SAFETY: the range lies inside the live buffer; `host` has room for `len` elements of
        // plain data.
        let code = unsafe {
            (f.dtoh)(
                host.as_mut_ptr().cast(),
                self.device_ptr_at(at),
                std::mem::size_of_val(&host[..]),
            )
        };
        self.ctx.driver.check("cuMemcpyDtoH", code)?;
        Ok(host)
    }

    /// Copies `count` elements from `src[src_at..]` to `self[dst_at..]` on the device.
    pub fn copy_from(
        &self,
        dst_at: usize,
        src: &DeviceBuffer<T>,
        src_at: usize,
        count: usize,
    ) -> Result<(), CudaError> {
        if dst_at + count > self.len || src_at + count > src.len {
            return Err(CudaError::Invalid(format!(
                "device copy of {count} at {src_at} → {dst_at} out of bounds ({} → {})",
                src.len, self.len
            )));
        }
        let size = std::mem::size_of::<T>();
        let f = self.ctx.current()?;
        // SAFETY: both ranges were checked to lie inside their live buffers.
        let code = unsafe {
            (f.dtod)(
                self.ptr + (dst_at * size) as u64,
                src.ptr + (src_at * size) as u64,
                count * size,
            )
        };
        self.ctx.driver.check("cuMemcpyDtoD", code)
    }

    fn check_len(&self, n: usize) -> Result<(), CudaError> {
        if n != self.len {
            return Err(CudaError::Invalid(format!(
                "copy of {n} elements into a buffer of {}",
                self.len
            )));
        }
        Ok(())
    }
}

impl<T: DeviceScalar> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if let Ok(f) = self.ctx.current() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once.
            unsafe { (f.mem_free)(self.ptr) };
        }
    }
}
