// gRPC's completion-queue contract, and the order of a callback call's OnCancel and OnDone,
// as ThreadSanitizer needs to see them. Linked into every program of a ThreadSanitizer build,
// and only there (see CMakeLists.txt in this directory).
//
// Why: gRPC promises that what a thread did before it started a batch of operations with a
// tag (grpc_call_start_batch, grpc_server_request_call) happens before that tag comes out
// of a completion queue, where the thread that takes it runs the tag's callback. Debian's
// gRPC is not built with -fsanitize=thread, and between those two points the work travels
// through lock-free queues and atomics that TSan cannot see. The callback machinery that
// gRPC's C++ headers compile into our own objects (CallOpSet, CallbackWithSuccessTag, the
// reactors) is instrumented, so TSan saw its state and our callbacks' captures written on
// one thread and read on another with nothing in between, and reported races.
//
// How: these C functions, defined in the program, take the place of libgrpc's for every
// caller (libgrpc++ calls them through the PLT). Each forwards to libgrpc's own, found with
// dlsym(RTLD_NEXT), and adds the edge gRPC promises: a release on the tag where a batch
// starts, an acquire on it where the tag is taken from the queue. Nothing else is ordered:
// two accesses that gRPC does not order are still reported.
//
// The same holds for a callback call's OnCancel and OnDone. gRPC counts what each waits
// for in an atomic of the call (ServerCallbackCall's on_cancel_conditions_remaining_ and
// callbacks_outstanding_), each condition met by a fetch_sub (acq_rel), and the fetch_sub
// that takes a count to zero calls ServerCallbackCall::CallOnCancel or ScheduleOnDone,
// which run the reaction or hand it to gRPC's executor (grpc_core::Executor::Run). Some
// of those fetch_subs are compiled into our objects from gRPC's headers, and TSan sees
// them; others are inside libgrpc++, and it does not. OnCancel, for one, waits for the
// handler to have returned its reactor and for the call to have ended cancelled:
//   handler thread: reactor constructed -> SetupReactor -> MaybeCallOnCancel: fetch_sub
//     (in our objects: TSan sees its release)
//   completion-queue thread: CompletionOp::FinalizeResult -> MaybeCallOnCancel: fetch_sub
//     (inside libgrpc++: TSan misses its acquire) -> CallOnCancel -> Executor::Run,
//     which queues the closure under a gpr_mu, an absl::Mutex (tsan_absl_mutex.cc)
//   executor thread: takes the closure under that gpr_mu -> reactor->OnCancel()
// When the handler's fetch_sub came last, TSan saw every step. When the CompletionOp's
// did, TSan saw the reactor's constructor write and OnCancel read with nothing in between,
// and reported a race in the reactor. OnDone likewise, when the last of the call's
// references went in libgrpc++ (the closure that ran OnCancel drops one). The program's
// own CallOnCancel and ScheduleOnDone below make the acquire that the last fetch_sub made,
// on its counter, before they call libgrpc++'s: a reaction is ordered after what came
// before the counts it waited for, and after nothing else.
#include <dlfcn.h>
#include <grpc/grpc.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/version_info.h>
#include <sanitizer/tsan_interface.h>

#if GRPC_CPP_VERSION_MAJOR != 1 || GRPC_CPP_VERSION_MINOR != 51
#error "CallOnCancel and ScheduleOnDone are gRPC 1.51's: check them against server_callback.h."
#endif

#include <cstdio>
#include <cstdlib>

namespace {

// libgrpc's definition of `name`. Each definition below looks its own up once, into a
// static: LIBGRPC(f) is libgrpc's f.
template <typename F>
F Find(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_grpc: %s not found in the gRPC library\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}
#define LIBGRPC(f) Find<decltype(&f)>(#f)

void Started(void* tag) {
  if (tag != nullptr) __tsan_release(tag);
}

grpc_event Taken(grpc_event event) {
  if (event.type == GRPC_OP_COMPLETE && event.tag != nullptr) __tsan_acquire(event.tag);
  return event;
}

}  // namespace

extern "C" {

grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops, void* tag,
                                      void* reserved) {
  static const auto start_batch = LIBGRPC(grpc_call_start_batch);
  Started(tag);
  return start_batch(call, ops, nops, tag, reserved);
}

grpc_call_error grpc_server_request_call(grpc_server* server, grpc_call** call,
                                         grpc_call_details* details,
                                         grpc_metadata_array* request_metadata,
                                         grpc_completion_queue* cq_bound_to_call,
                                         grpc_completion_queue* cq_for_notification,
                                         void* tag_new) {
  static const auto request_call = LIBGRPC(grpc_server_request_call);
  Started(tag_new);
  return request_call(server, call, details, request_metadata, cq_bound_to_call,
                      cq_for_notification, tag_new);
}

grpc_call_error grpc_server_request_registered_call(grpc_server* server, void* registered_method,
                                                    grpc_call** call, gpr_timespec* deadline,
                                                    grpc_metadata_array* request_metadata,
                                                    grpc_byte_buffer** optional_payload,
                                                    grpc_completion_queue* cq_bound_to_call,
                                                    grpc_completion_queue* cq_for_notification,
                                                    void* tag_new) {
  static const auto request_registered_call = LIBGRPC(grpc_server_request_registered_call);
  Started(tag_new);
  return request_registered_call(server, registered_method, call, deadline, request_metadata,
                                 optional_payload, cq_bound_to_call, cq_for_notification, tag_new);
}

grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline,
                                      void* reserved) {
  static const auto next = LIBGRPC(grpc_completion_queue_next);
  return Taken(next(cq, deadline, reserved));
}

grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag, gpr_timespec deadline,
                                       void* reserved) {
  static const auto pluck = LIBGRPC(grpc_completion_queue_pluck);
  return Taken(pluck(cq, tag, deadline, reserved));
}

}  // extern "C"

namespace grpc::internal {

// Both are called through the PLT: by libgrpc++ and by the code that
// grpcpp/impl/codegen/server_callback_handlers.h compiles into our objects.
void ServerCallbackCall::CallOnCancel(ServerReactor* reactor) {
  static const auto call_on_cancel = Find<void (*)(ServerCallbackCall*, ServerReactor*)>(
      "_ZN4grpc8internal18ServerCallbackCall12CallOnCancelEPNS0_13ServerReactorE");
  __tsan_acquire(&on_cancel_conditions_remaining_);
  call_on_cancel(this, reactor);
}

void ServerCallbackCall::ScheduleOnDone(bool inline_ondone) {
  static const auto schedule_on_done = Find<void (*)(ServerCallbackCall*, bool)>(
      "_ZN4grpc8internal18ServerCallbackCall14ScheduleOnDoneEb");
  __tsan_acquire(&callbacks_outstanding_);
  schedule_on_done(this, inline_ondone);
}

}  // namespace grpc::internal
