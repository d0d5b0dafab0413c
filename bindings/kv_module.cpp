// Python bindings of the KV-transfer extension: one-line definitions; specgen/kv/ owns the
// documentation, argument checking and the objects Python code uses.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../csrc/block_table.h"
#include "../csrc/cuda_ops.h"
#include "../csrc/pool_core.h"
#include "../csrc/pool_server.h"
#include "../csrc/transfer.h"

namespace py = pybind11;
using namespace specgen_kv;

namespace {

using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using KeyArray = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

py::array_t<int64_t> to_array(const std::vector<int64_t>& v) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

py::array_t<uint64_t> to_array(const std::vector<uint64_t>& v) {
  py::array_t<uint64_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

void check_same_length(const Int64Array& a, const Int64Array& b, const char* what) {
  if (a.ndim() != 1 || b.ndim() != 1 || a.shape(0) != b.shape(0)) {
    throw KvError(std::string(what) + ": both index arrays must be one-dimensional and of equal length", __FILE__,
                  __LINE__);
  }
}

}  // namespace

PYBIND11_MODULE(_kv_transfer, m) {
  m.doc() = "KV-block transfer extension (see specgen.kv)";
  // Module-local types and exception: a second build of this module (e.g. the CPU-only one a test
  // builds) can be loaded beside the installed one without the two fighting over type registrations.
  py::register_local_exception<KvError>(m, "KvTransferError", PyExc_RuntimeError);

  py::enum_<Method>(m, "Method", py::module_local())
      .value("AUTO", Method::Auto)
      .value("KERNEL", Method::Kernel)
      .value("BATCH", Method::Batch)
      .value("MEMCPY", Method::Memcpy)
      .value("PERSISTENT", Method::Persistent);

  m.def("cuda_compiled", &cuda_ops::compiled);
  m.def("cuda_runtime_version", &cuda_ops::runtime_version);
  m.def("device_count", &cuda_ops::device_count);
  m.def("pointer_device", &cuda_ops::pointer_device);
  m.def("multiprocessor_count", &cuda_ops::multiprocessor_count);
  m.def("mem_get_info", &cuda_ops::mem_get_info);
  m.def("device_alloc", &cuda_ops::device_alloc);
  // cudaFree waits for the device's work in flight: let the process's other threads run meanwhile.
  m.def("device_free", &cuda_ops::device_free, py::call_guard<py::gil_scoped_release>());
  // A shrink frees its segments together: one hand-over of the interpreter instead of one per segment.
  m.def("device_free_many", &cuda_ops::device_free_many, py::call_guard<py::gil_scoped_release>());
  m.def("device_memset", &cuda_ops::device_memset);
  m.def("enable_peer_access", &cuda_ops::enable_peer_access);
  m.def("can_access_peer", &cuda_ops::can_access_peer);
  m.def("ipc_export", [](int device, uint64_t ptr) { return py::bytes(cuda_ops::ipc_export(device, ptr)); });
  m.def("ipc_open", [](int device, py::bytes handle) { return cuda_ops::ipc_open(device, std::string(handle)); });
  m.def("ipc_close", &cuda_ops::ipc_close);
  m.def("memcpy_peer", &cuda_ops::memcpy_peer);
  m.def("clock_rate_khz", &cuda_ops::clock_rate_khz);
  m.def("stream_synchronize", &cuda_ops::stream_synchronize, py::call_guard<py::gil_scoped_release>());

  py::class_<Region>(m, "Region", py::module_local())
      .def(py::init([](uint64_t base, int64_t block_stride, int64_t bytes, int64_t slot_offset) {
             return Region{base, block_stride, bytes, slot_offset};
           }),
           py::arg("base"), py::arg("block_stride"), py::arg("bytes"), py::arg("slot_offset"))
      .def_readonly("base", &Region::base)
      .def_readonly("block_stride", &Region::block_stride)
      .def_readonly("bytes", &Region::bytes)
      .def_readonly("slot_offset", &Region::slot_offset);

  py::class_<CopyEvent, std::shared_ptr<CopyEvent>>(m, "CopyEvent", py::module_local())
      .def("done", &CopyEvent::done)
      .def("wait", &CopyEvent::wait, py::arg("timeout_s") = -1.0, py::call_guard<py::gil_scoped_release>());
  // Waits for every event with the interpreter released once (a shrink waiting for the loads that pin
  // its blocks would otherwise take the interpreter back after each one, behind the loading thread).
  m.def(
      "wait_events",
      [](const std::vector<std::shared_ptr<CopyEvent>>& events, double timeout_s) {
        py::gil_scoped_release release;
        for (const auto& event : events) event->wait(timeout_s);
      },
      py::arg("events"), py::arg("timeout_s") = -1.0);

  py::class_<cuda_ops::KernelConfig>(m, "KernelConfig", py::module_local())
      .def_readwrite("warps_per_cta", &cuda_ops::KernelConfig::warps_per_cta)
      .def_readwrite("ctas_per_sm", &cuda_ops::KernelConfig::ctas_per_sm);

  py::class_<Transfer, std::shared_ptr<Transfer>>(m, "Transfer", py::module_local())
      .def(py::init<int, std::vector<Region>, int64_t, int64_t, int64_t, int64_t>(), py::arg("device"),
           py::arg("regions"), py::arg("num_blocks"), py::arg("slot_bytes"), py::arg("slots_per_segment"),
           py::arg("max_segments"))
      .def("set_segment", &Transfer::set_segment)
      .def(
          "copy",
          [](Transfer& t, bool to_pool, const Int64Array& blocks, const Int64Array& slots, uint64_t stream,
             std::optional<uint64_t> after, Method method) {
            check_same_length(blocks, slots, "copy");
            if (t.device() < 0) {
              // Host copies can be large: let other Python threads run meanwhile.
              py::gil_scoped_release release;
              return t.copy(to_pool, blocks.data(), slots.data(), blocks.shape(0), stream, after, method);
            }
            return t.copy(to_pool, blocks.data(), slots.data(), blocks.shape(0), stream, after, method);
          },
          py::arg("to_pool"), py::arg("blocks"), py::arg("slots"), py::arg("stream") = 0, py::arg("after") = py::none(),
          py::arg("method") = Method::Auto)
      .def(
          "move_slots",
          [](Transfer& t, const Int64Array& from, const Int64Array& to, uint64_t stream) {
            check_same_length(from, to, "move_slots");
            py::gil_scoped_release release;
            return t.move_slots(from.data(), to.data(), from.shape(0), stream);
          },
          py::arg("src_slots"), py::arg("dst_slots"), py::arg("stream") = 0)
      .def("resolve", &Transfer::resolve)
      .def("start_persistent", &Transfer::start_persistent, py::arg("idle_us") = 200)
      .def("persistent_launches", &Transfer::persistent_launches)
      .def("stop_persistent", &Transfer::stop_persistent, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("persistent_running", &Transfer::persistent_running)
      .def("persistent_last_timing", &Transfer::persistent_last_timing)
      .def_property_readonly("device", &Transfer::device)
      .def_property_readonly("num_blocks", &Transfer::num_blocks)
      .def_property_readonly("slot_bytes", &Transfer::slot_bytes)
      .def_property_readonly("slots_per_segment", &Transfer::slots_per_segment)
      .def_property_readonly("max_segments", &Transfer::max_segments)
      .def_property_readonly("block_bytes", &Transfer::block_bytes)
      .def_property_readonly("segments", &Transfer::segments)
      .def_readwrite("kernel_config", &Transfer::kernel_config)
      .def_readwrite("batch_min_bytes", &Transfer::batch_min_bytes);

  py::class_<BlockTableStats>(m, "BlockTableStats", py::module_local())
      .def_readonly("entries", &BlockTableStats::entries)
      .def_readonly("capacity", &BlockTableStats::capacity)
      .def_readonly("free", &BlockTableStats::free)
      .def_readonly("pinned", &BlockTableStats::pinned)
      .def_readonly("hits", &BlockTableStats::hits)
      .def_readonly("misses", &BlockTableStats::misses)
      .def_readonly("stores", &BlockTableStats::stores)
      .def_readonly("loads", &BlockTableStats::loads)
      .def_readonly("evictions", &BlockTableStats::evictions)
      .def_readonly("moves", &BlockTableStats::moves);

  py::class_<BlockTable>(m, "BlockTable", py::module_local())
      .def(py::init<int64_t>(), py::arg("max_slots"))
      .def_property_readonly("max_slots", &BlockTable::max_slots)
      .def("__len__", &BlockTable::size)
      .def("stats", &BlockTable::stats)
      .def("enable_slots", &BlockTable::enable_slots)
      .def("retire_slots",
           [](BlockTable& t, int64_t lo, int64_t hi, bool relocate) {
             RetirePlan plan = t.retire_slots(lo, hi, relocate);
             std::vector<uint64_t> keys;
             std::vector<int64_t> from, to;
             for (const SlotMove& mv : plan.moves) {
               keys.push_back(mv.key);
               from.push_back(mv.from);
               to.push_back(mv.to);
             }
             return py::make_tuple(to_array(keys), to_array(from), to_array(to), to_array(plan.evicted), plan.busy);
           },
           py::arg("lo"), py::arg("hi"), py::arg("relocate") = true)
      .def("used_in_range", &BlockTable::used_in_range)
      .def("disable_slots", &BlockTable::disable_slots)
      .def("finish_moves",
           [](BlockTable& t, const KeyArray& keys, bool ok) { t.finish_moves(keys.data(), keys.size(), ok); },
           py::arg("keys"), py::arg("ok") = true)
      .def("allocate",
           [](BlockTable& t, const KeyArray& keys) {
             AllocateResult r = t.allocate(keys.data(), keys.size());
             return py::make_tuple(to_array(r.slots), to_array(r.evicted));
           })
      .def("complete_store",
           [](BlockTable& t, const KeyArray& keys, bool success) { t.complete_store(keys.data(), keys.size(), success); })
      .def("lookup", &BlockTable::lookup)
      .def("peek", &BlockTable::peek)
      .def("lookup_prefix", [](BlockTable& t, const KeyArray& keys) { return t.lookup_prefix(keys.data(), keys.size()); })
      .def("acquire",
           [](BlockTable& t, const KeyArray& keys) {
             py::array_t<int64_t> slots(keys.size());
             t.acquire(keys.data(), keys.size(), slots.mutable_data());
             return slots;
           })
      .def("release", [](BlockTable& t, const KeyArray& keys) { t.release(keys.data(), keys.size()); })
      .def("touch", [](BlockTable& t, const KeyArray& keys) { t.touch(keys.data(), keys.size()); })
      .def("slot_of", &BlockTable::slot_of)
      .def("remove", [](BlockTable& t, const KeyArray& keys) { return to_array(t.remove(keys.data(), keys.size())); })
      .def("clear", [](BlockTable& t) { return to_array(t.clear()); })
      .def("acquire_prefix", [](BlockTable& t, const KeyArray& keys) {
        py::array_t<int64_t> slots(keys.size());
        const int64_t held = t.acquire_prefix(keys.data(), keys.size(), slots.mutable_data());
        return py::array_t<int64_t>(held, slots.data());
      });

  py::class_<PoolSegment>(m, "PoolSegment", py::module_local())
      .def_readonly("index", &PoolSegment::index)
      .def_readonly("serial", &PoolSegment::serial)
      .def_readonly("address", &PoolSegment::address)
      .def_readonly("device", &PoolSegment::device)
      .def_readonly("nbytes", &PoolSegment::nbytes)
      .def_readonly("owned", &PoolSegment::owned);

  py::class_<PoolCounters>(m, "PoolCounters", py::module_local())
      .def_readonly("table", &PoolCounters::table)
      .def_readonly("capacity_bytes", &PoolCounters::capacity_bytes)
      .def_readonly("segments", &PoolCounters::segments)
      .def_readonly("grows", &PoolCounters::grows)
      .def_readonly("shrinks", &PoolCounters::shrinks)
      .def_readonly("late_misses", &PoolCounters::late_misses)
      .def_readonly("inflight", &PoolCounters::inflight)
      .def_readonly("bytes_by_device", &PoolCounters::bytes_by_device);

  py::class_<ReleaseReport>(m, "ReleaseReport", py::module_local())
      .def_readonly("freed_bytes", &ReleaseReport::freed_bytes)
      .def_readonly("lent", &ReleaseReport::lent)
      .def_readonly("began_s", &ReleaseReport::began_s)
      .def_readonly("ended_s", &ReleaseReport::ended_s)
      .def_readonly("retire_ms", &ReleaseReport::retire_ms)
      .def_readonly("wait_ms", &ReleaseReport::wait_ms)
      .def_readonly("free_ms", &ReleaseReport::free_ms)
      .def_readonly("passes", &ReleaseReport::passes)
      .def_readonly("timed_out", &ReleaseReport::timed_out)
      .def_readonly("busy", &ReleaseReport::busy);

  // Calls that may wait (for copies, cudaMalloc/cudaFree, the give-back's locks) release the
  // interpreter; the short bookkeeping calls keep it.
  using release_gil = py::call_guard<py::gil_scoped_release>;
  py::class_<PoolCore, std::shared_ptr<PoolCore>>(m, "PoolCore", py::module_local())
      .def(py::init<std::shared_ptr<Transfer>, int64_t, int64_t, int64_t, int64_t, std::vector<int>>(),
           py::arg("transfer"), py::arg("max_segments"), py::arg("slots_per_segment"), py::arg("headroom_bytes"),
           py::arg("max_bytes"), py::arg("devices"))
      .def_property_readonly("table", &PoolCore::table, py::return_value_policy::reference_internal)
      .def_property_readonly("segment_bytes", &PoolCore::segment_bytes)
      .def("set_headroom", &PoolCore::set_headroom)
      .def("acquire_prefix",
           [](PoolCore& c, const KeyArray& keys) {
             py::array_t<int64_t> slots(keys.size());
             const int64_t held = c.acquire_prefix(keys.data(), keys.size(), slots.mutable_data());
             return py::array_t<int64_t>(held, slots.data());
           })
      .def("track",
           [](PoolCore& c, std::shared_ptr<CopyEvent> event, const KeyArray& keys, bool store) {
             return c.track(std::move(event), std::vector<uint64_t>(keys.data(), keys.data() + keys.size()), store);
           })
      .def("finish", &PoolCore::finish)
      .def("poll", &PoolCore::poll)
      .def("wait_all", &PoolCore::wait_all, release_gil())
      .def("grow", &PoolCore::grow, py::arg("nbytes"), py::arg("device"), release_gil())
      .def("add_segment", &PoolCore::add_segment, py::arg("address"), py::arg("device"), py::arg("nbytes"),
           py::arg("owned"))
      .def("shrink", &PoolCore::shrink, py::arg("nbytes"), py::arg("device"), py::arg("timeout_s"),
           py::arg("relocate"), py::arg("include_lent"), release_gil())
      .def("release_segment", &PoolCore::release_segment, py::arg("index"), py::arg("timeout_s"),
           py::arg("relocate"), release_gil())
      .def("counters", &PoolCore::counters)
      .def("segments", &PoolCore::segments)
      .def_property_readonly("capacity_bytes", &PoolCore::capacity_bytes)
      .def("close", &PoolCore::close, release_gil());

  py::class_<PoolServer>(m, "PoolServer", py::module_local())
      .def(py::init<std::shared_ptr<PoolCore>, int, double>(), py::arg("core"), py::arg("fd"),
           py::arg("shrink_timeout_s"))
      .def("stop", &PoolServer::stop, release_gil())
      .def_property_readonly("served", &PoolServer::served)
      .def("last_reply", [](const PoolServer& server) {
        const PoolReply reply = server.last_reply();
        return py::bytes(reinterpret_cast<const char*>(&reply), sizeof(reply));
      });
  m.attr("ANY_DEVICE") = kAnyDevice;
  m.attr("POOL_REQUEST_BYTES") = sizeof(PoolRequest);
  m.attr("POOL_REPLY_BYTES") = sizeof(PoolReply);
  m.attr("ALREADY_PRESENT") = BlockTable::kAlreadyPresent;
  m.attr("NO_ROOM") = BlockTable::kNoRoom;
  m.attr("MISS") = BlockTable::kMiss;
  m.attr("HIT") = BlockTable::kHit;
  m.attr("PENDING") = BlockTable::kPending;
}
