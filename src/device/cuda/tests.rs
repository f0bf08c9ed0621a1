//! Tests of [`CudaDevice`]: the refusal without CUDA (runs everywhere), and the
//! device itself against the host kernels (runs only where a GPU is; prints a skip
//! line otherwise).

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::{bf16, f16};

use super::CudaDevice;
use crate::device::{Device, DeviceBuffer, HostBuffer, Ticket};
use crate::error::Error;
use crate::transport::devices::cuda_devices;
use crate::types::{DType, ReduceOp};

#[test]
fn new_is_a_device_or_an_unsupported_error_naming_cuda() {
    // SAFETY: only tries to load the driver library.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    match CudaDevice::new(0) {
        Ok(dev) => {
            assert!(driver);
            assert!(dev.describe().starts_with("cuda:0 ("), "{}", dev.describe());
        }
        Err(Error::Unsupported(m)) => {
            eprintln!("CudaDevice::new(0): {m}");
            assert!(m.starts_with("cuda:0: ") && m.contains("CUDA"), "{m}");
            assert!(!m.contains('\n'), "one line: {m}");
            if !driver {
                assert!(m.contains("no CUDA driver"), "{m}");
            }
        }
        Err(other) => panic!("expected a device or Unsupported, got {other:?}"),
    }
}

#[test]
fn a_device_past_the_last_is_unsupported() {
    match CudaDevice::new(100_000) {
        Err(Error::Unsupported(m)) => assert!(m.starts_with("cuda:100000: ") && m.contains("CUDA"), "{m}"),
        other => panic!("expected Unsupported, got {:?}", other.map(|d| d.describe())),
    }
}

/// On CI's stub driver with one device (`STUB_CUDA_DEVICES=1`, no NVRTC on the
/// library path): a device gets as far as loading the embedded PTX, which the stub
/// checks is braid's and refuses for want of a device.
#[test]
fn the_embedded_ptx_reaches_the_drivers_module_loader() {
    if std::env::var("STUB_CUDA_DEVICES").as_deref() != Ok("1") {
        eprintln!("skipping the_embedded_ptx_reaches_the_drivers_module_loader: runs on CI's stub driver");
        return;
    }
    match CudaDevice::new(0) {
        Err(Error::Device(m)) => {
            assert!(m.starts_with("cuda:0 (stub device): loading the reduction kernels: "), "{m}");
            assert!(m.contains("CUDA_ERROR_NO_DEVICE"), "the stub did not take the image for braid's PTX: {m}");
        }
        other => panic!("expected the stub's refusal of the module, got {:?}", other.map(|d| d.describe())),
    }
}

/// Device 0, or `None` after printing why the GPU tests skip.
fn gpu(test: &str) -> Option<Arc<CudaDevice>> {
    if let Err(why) = cuda_devices() {
        eprintln!("skipping {test}: {why}");
        return None;
    }
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(Error::Unsupported(why)) => {
            eprintln!("skipping {test}: {why}");
            None
        }
        Err(e) => panic!("{test}: a GPU is present but the device failed: {e}"),
    }
}

/// `n` elements of small integers (exact in every dtype, as are their sums and
/// products), as bytes; `salt` varies the sequence.
fn integers(dtype: DType, n: usize, salt: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n as i64 {
        let v = (i * (5 + 2 * salt) + salt) % 13 - 6;
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&(v as f64).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f32(v as f32).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f32(v as f32).to_le_bytes()),
            DType::I8 => out.push(v as i8 as u8),
            DType::U8 => out.push(v as u8),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

fn upload(dev: &Arc<dyn Device>, data: &[u8]) -> DeviceBuffer {
    let mut b = DeviceBuffer::new(dev, data.len()).unwrap();
    b.write(data).unwrap();
    b
}

fn download(b: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; b.len()];
    b.read(&mut out).unwrap();
    out
}

#[test]
fn gpu_reduce_and_finalize_match_the_host_for_every_dtype_and_op() {
    let Some(cuda) = gpu("gpu_reduce_and_finalize_match_the_host_for_every_dtype_and_op") else { return };
    let dev: Arc<dyn Device> = cuda;
    // Not a multiple of the block size, and more than one block.
    let n = 70_001;
    for dtype in DType::ALL {
        let (a, b) = (integers(dtype, n, 1), integers(dtype, n, 2));
        let (da, db) = (upload(&dev, &a), upload(&dev, &b));
        for op in ReduceOp::ALL {
            let mut want = vec![0u8; a.len()];
            crate::reduce::reduce_into(dtype, op, &mut want, &a, &b).unwrap();
            let out = DeviceBuffer::new(&dev, a.len()).unwrap();
            // SAFETY: three live device buffers of a.len() bytes, used only here.
            unsafe { dev.reduce(out.ptr(), da.ptr(), db.ptr(), a.len(), dtype, op) }.unwrap();
            assert!(download(&out) == want, "{dtype} {op}: device result differs from the host's");

            // In place, then the average's division, as the executor does.
            let acc = upload(&dev, &a);
            // SAFETY: as above; dst == a is allowed.
            unsafe { dev.reduce(acc.ptr(), acc.ptr(), db.ptr(), a.len(), dtype, op) }.unwrap();
            assert!(download(&acc) == want, "{dtype} {op} in place: device result differs from the host's");
            for world in [1usize, 3, 8] {
                let mut host = want.clone();
                crate::reduce::finalize(dtype, op, &mut host, world).unwrap();
                let buf = upload(&dev, &want);
                // SAFETY: a live device buffer of want.len() bytes.
                unsafe { dev.finalize(buf.ptr(), want.len(), dtype, op, world) }.unwrap();
                assert!(download(&buf) == host, "{dtype} {op} finalize over {world}: differs from the host's");
            }
        }
    }
}

#[test]
fn gpu_reduce_and_finalize_match_the_host_on_adversarial_bits() {
    // NaN payloads, signed zeros, subnormals, overflow and rounding ties: where the
    // GPU's own float behaviour (canonical NaN 0x7FFFFFFF, min/max instructions)
    // would differ from the host's, the kernels must not.
    let Some(cuda) = gpu("gpu_reduce_and_finalize_match_the_host_on_adversarial_bits") else { return };
    let dev: Arc<dyn Device> = cuda;
    let mut rng = super::kernels::tests::Rng(0x5DEE_CE66_D1CE_4E5B);
    for dtype in DType::ALL {
        let (a, b) = super::kernels::tests::operands(dtype, &mut rng);
        let (da, db) = (upload(&dev, &a), upload(&dev, &b));
        for op in super::kernels::COMBINERS {
            let mut want = vec![0u8; a.len()];
            crate::reduce::reduce_into(dtype, op, &mut want, &a, &b).unwrap();
            let out = DeviceBuffer::new(&dev, a.len()).unwrap();
            // SAFETY: three live device buffers of a.len() bytes, used only here.
            unsafe { dev.reduce(out.ptr(), da.ptr(), db.ptr(), a.len(), dtype, op) }.unwrap();
            let got = download(&out);
            let s = dtype.size();
            if let Some(i) = (0..a.len() / s).find(|i| got[i * s..(i + 1) * s] != want[i * s..(i + 1) * s]) {
                let r = i * s..(i + 1) * s;
                panic!(
                    "{dtype} {op} element {i}: a={:02x?} b={:02x?} gpu={:02x?} host={:02x?}",
                    &a[r.clone()],
                    &b[r.clone()],
                    &got[r.clone()],
                    &want[r]
                );
            }
        }
        for world in [3usize, 1000] {
            let mut host = a.clone();
            crate::reduce::finalize(dtype, ReduceOp::Avg, &mut host, world).unwrap();
            let buf = upload(&dev, &a);
            // SAFETY: a live device buffer of a.len() bytes.
            unsafe { dev.finalize(buf.ptr(), a.len(), dtype, ReduceOp::Avg, world) }.unwrap();
            assert!(download(&buf) == host, "{dtype} avg over {world}: differs from the host's");
        }
    }
}

#[test]
fn gpu_reduce_refuses_partial_and_misaligned_elements() {
    let Some(cuda) = gpu("gpu_reduce_refuses_partial_and_misaligned_elements") else { return };
    let dev: Arc<dyn Device> = cuda;
    let buf = DeviceBuffer::new(&dev, 64).unwrap();
    let p = buf.ptr();
    // SAFETY: refused before anything is enqueued (lengths and alignment checked).
    let partial = unsafe { dev.reduce(p, p, p, 6, DType::F32, ReduceOp::Sum) };
    assert!(matches!(partial, Err(Error::InvalidArgument(_))), "{partial:?}");
    // SAFETY: as above.
    let misaligned = unsafe { dev.reduce(p + 2, p, p, 8, DType::F32, ReduceOp::Sum) };
    assert!(matches!(misaligned, Err(Error::InvalidArgument(_))), "{misaligned:?}");
    // The device still works afterwards (nothing faulted).
    let data: Vec<u8> = (0..64).collect();
    let again = upload(&dev, &data);
    assert_eq!(download(&again), data);
}

#[test]
fn gpu_tickets_complete_in_order() {
    let Some(cuda) = gpu("gpu_tickets_complete_in_order") else { return };
    let dev: Arc<dyn Device> = cuda;
    let len = 8 << 20;
    let a = upload(&dev, &integers(DType::F32, len / 4, 1));
    let t1 = dev.record().unwrap();
    // SAFETY: a live device buffer of `len` bytes, reduced in place.
    unsafe { dev.reduce(a.ptr(), a.ptr(), a.ptr(), len, DType::F32, ReduceOp::Sum) }.unwrap();
    let t2 = dev.record().unwrap();
    assert!(t2 > t1);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dev.is_complete(t2).unwrap() {
        assert!(Instant::now() < deadline, "ticket {t2:?} never completed");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(dev.is_complete(t1).unwrap(), "an earlier ticket completes with a later one");
    assert!(matches!(dev.is_complete(Ticket(t2.0 + 100)), Err(Error::InvalidArgument(_))));
    let t3 = dev.record().unwrap();
    dev.synchronize().unwrap();
    assert!(dev.is_complete(t3).unwrap());
}

#[test]
fn gpu_overlapping_device_copies_move_like_memmove() {
    let Some(cuda) = gpu("gpu_overlapping_device_copies_move_like_memmove") else { return };
    let dev: Arc<dyn Device> = cuda;
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    // (dst offset, src offset, len): few pieces either way, and a detour through scratch.
    for (d, s, len) in [(1000usize, 0usize, 3000usize), (0, 1000, 3000), (1, 0, 8000), (0, 3, 8000), (100, 100, 500)] {
        let buf = upload(&dev, &data);
        // SAFETY: both ranges lie inside the 8192-byte buffer.
        unsafe { dev.copy_on_device(buf.ptr() + d as u64, buf.ptr() + s as u64, len) }.unwrap();
        let mut want = data.clone();
        want.copy_within(s..s + len, d);
        assert!(download(&buf) == want, "copy of {len} bytes from +{s} to +{d}");
    }
}

#[test]
fn gpu_pinned_staging_round_trips_and_is_reused() {
    let Some(cuda) = gpu("gpu_pinned_staging_round_trips_and_is_reused") else { return };
    let dev: Arc<dyn Device> = cuda.clone();
    let len = 10_000;
    let first = HostBuffer::new(&dev, len).unwrap();
    let p = first.ptr();
    drop(first);
    assert_eq!(cuda.pooled_host_bytes(), 16384);
    let src = HostBuffer::new(&dev, len).unwrap();
    assert_eq!(src.ptr(), p, "a freed pinned buffer of the same class is reused");
    let dst = HostBuffer::new(&dev, len).unwrap();
    let on_dev = DeviceBuffer::new(&dev, len).unwrap();
    // SAFETY: both host buffers are ours, `len` bytes each, and are not touched
    // until after the synchronize below.
    unsafe {
        for i in 0..len {
            *src.ptr().add(i) = (i % 253) as u8;
        }
        dev.copy_to_device(on_dev.ptr(), src.ptr(), len).unwrap();
        dev.copy_to_host(dst.ptr(), on_dev.ptr(), len).unwrap();
    }
    dev.synchronize().unwrap();
    // SAFETY: the copies completed (synchronize); `dst` holds `len` initialised bytes.
    let back = unsafe { std::slice::from_raw_parts(dst.ptr(), len) };
    assert!(back.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8));
}

#[test]
fn gpu_device_on_a_callers_stream_orders_after_its_work() {
    let Some(cuda) = gpu("gpu_device_on_a_callers_stream_orders_after_its_work") else { return };
    let shared = CudaDevice::on_stream(cuda.stream().clone()).unwrap();
    assert_eq!(shared.describe(), cuda.describe());
    let (d1, d2): (Arc<dyn Device>, Arc<dyn Device>) = (cuda, shared);
    let data = integers(DType::I32, 1024, 3);
    let a = upload(&d1, &data);
    let out = DeviceBuffer::new(&d2, data.len()).unwrap();
    // Enqueued through one device, consumed through the other: same stream, so in order.
    // SAFETY: live device buffers of data.len() bytes on the same context.
    unsafe {
        d1.copy_on_device(out.ptr(), a.ptr(), data.len()).unwrap();
        d2.reduce(out.ptr(), out.ptr(), a.ptr(), data.len(), DType::I32, ReduceOp::Sum).unwrap();
    }
    let mut want = vec![0u8; data.len()];
    crate::reduce::reduce_into(DType::I32, ReduceOp::Sum, &mut want, &data, &data).unwrap();
    assert!(download(&out) == want);
}
