// kfuse's call path in C: the hit path of a compiled pipeline's call.
//
// A call of a compiled pipeline (kfuse.runtime.compiled) whose signature is already compiled
// does little: describe each input array, find the signature, take the outputs from the
// caller's allocator, write the arrays' addresses and the parameters into the kernels'
// argument blocks and launch them (or replay the CUDA graph captured for these arrays). In
// Python that is about 7 microseconds of interpreter work per call; here it is a fraction of
// one. Everything else -- a new signature, out= arrays, copies, a CUDA graph's capture, side
// streams, reductions' fills, errors -- stays in Python: where this code meets anything it
// does not handle it returns None before it has done anything, and the Python path runs.
//
// Built at first use by the host C++ compiler against Python's headers (kfuse.runtime.native);
// without them kfuse runs the same calls in Python.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>

namespace {

// cuLaunchKernel's signature (the cpu backend gets a function of the same shape below).
typedef int (*LaunchFunction)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                              unsigned block_x, unsigned block_y, unsigned block_z,
                              unsigned shared_bytes, void* stream, void** arguments,
                              void** extra);
// cuGraphLaunch's.
typedef int (*GraphLaunchFunction)(void* graph_exec, void* stream);
// The launcher the cpu backend's generated library exports per kernel.
typedef int (*HostLauncher)(const unsigned* grid, const unsigned* block,
                            unsigned long long shared_bytes, void** arguments);

// The cpu backend's kernels behind cuLaunchKernel's signature: `function` is the address of
// the generated `kf_launch_<kernel>`.
extern "C" int kf_host_launch(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                              unsigned block_x, unsigned block_y, unsigned block_z,
                              unsigned shared_bytes, void*, void** arguments, void**) {
  const unsigned grid[3] = {grid_x, grid_y, grid_z};
  const unsigned block[3] = {block_x, block_y, block_z};
  return reinterpret_cast<HostLauncher>(function)(grid, block, shared_bytes, arguments);
}

enum ArrayKind { CUPY = 1, NUMPY = 2, TORCH = 3 };
// How a runtime parameter's value is checked (the dtype it is declared with) and written
// (the C type of its argument slot).
enum ParamCheck { FLOAT32 = 'f', FLOAT64 = 'd', INT32 = 'i', INT64 = 'q', BOOL = '?', OTHER = 'x' };

PyObject* s_shape; PyObject* s_dtype; PyObject* s_c_contiguous; PyObject* s_data; PyObject* s_ptr;
PyObject* s_device_id; PyObject* s_data_ptr; PyObject* s_is_contiguous; PyObject* s_device;
PyObject* s_index; PyObject* s_type; PyObject* s_cuda; PyObject* s_graph_exec;
PyObject* s_move_to_end; PyObject* s_calls; PyObject* s_hits; PyObject* s_native;
PyObject* s_graph_replays; PyObject* s_native_workspace; PyObject* s_native_launch;
PyObject* s_launch_failed; PyObject* s_launch_aside;
PyObject* one;  // the int 1

constexpr std::uintptr_t VECTOR_ALIGNMENT = 16;  // kfuse.runtime.backend.VECTOR_ALIGNMENT

// stats.<name> += 1
int bump(PyObject* stats, PyObject* name) {
  PyObject* value = PyObject_GetAttr(stats, name);
  if (value == nullptr) return -1;
  PyObject* more = PyNumber_Add(value, one);
  Py_DECREF(value);
  if (more == nullptr) return -1;
  int status = PyObject_SetAttr(stats, name, more);
  Py_DECREF(more);
  return status;
}

// -- Workspace: one signature's argument blocks on one stream ---------------------------------

struct Launch {
  void* function;
  unsigned grid[3], block[3], shared_bytes;
  void** arguments;
};
struct ArraySlot { void** slot; Py_ssize_t index; };
struct ParamSlot { void* slot; Py_ssize_t index; char kind; };

struct Workspace {
  PyObject_HEAD
  PyObject* owner;   // the Python workspace: its argument blocks (ctypes) and buffers
  PyObject* graphs;  // its CUDA graphs by (addresses, parameters)
  int direct;        // launches go from here (no fills, no side streams)
  int busy;          // a call is using the argument blocks (the others launch aside)
  LaunchFunction launch;
  GraphLaunchFunction graph_launch;
  Py_ssize_t launch_count, array_slot_count, param_slot_count;
  Launch* launches;
  ArraySlot* array_slots;
  ParamSlot* param_slots;
};

int workspace_traverse(Workspace* self, visitproc visit, void* arg) {
  Py_VISIT(self->owner);
  Py_VISIT(self->graphs);
  return 0;
}

int workspace_clear(Workspace* self) {
  Py_CLEAR(self->owner);
  Py_CLEAR(self->graphs);
  return 0;
}

void workspace_dealloc(Workspace* self) {
  PyObject_GC_UnTrack(self);
  workspace_clear(self);
  PyMem_Free(self->launches);
  PyMem_Free(self->array_slots);
  PyMem_Free(self->param_slots);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

void* as_pointer(PyObject* value) {
  return value == Py_None ? nullptr : PyLong_AsVoidPtr(value);
}

// Workspace(owner, graphs, direct, launch_address, graph_launch_address,
//           launches: [(function, gx, gy, gz, bx, by, bz, shared, arguments)],
//           array_slots: [(slot address, index)], param_slots: [(slot address, index, kind)])
int workspace_init(Workspace* self, PyObject* args, PyObject*) {
  PyObject *owner, *graphs, *launch, *graph_launch, *launches, *array_slots, *param_slots;
  int direct;
  if (!PyArg_ParseTuple(args, "OOpOOO!O!O!", &owner, &graphs, &direct, &launch, &graph_launch,
                        &PyList_Type, &launches, &PyList_Type, &array_slots, &PyList_Type,
                        &param_slots))
    return -1;
  Py_INCREF(owner); Py_XSETREF(self->owner, owner);
  Py_INCREF(graphs); Py_XSETREF(self->graphs, graphs);
  self->direct = direct;
  self->launch = reinterpret_cast<LaunchFunction>(as_pointer(launch));
  self->graph_launch = reinterpret_cast<GraphLaunchFunction>(as_pointer(graph_launch));
  if (PyErr_Occurred()) return -1;
  self->launch_count = PyList_GET_SIZE(launches);
  self->array_slot_count = PyList_GET_SIZE(array_slots);
  self->param_slot_count = PyList_GET_SIZE(param_slots);
  self->launches = PyMem_New(Launch, self->launch_count + 1);
  self->array_slots = PyMem_New(ArraySlot, self->array_slot_count + 1);
  self->param_slots = PyMem_New(ParamSlot, self->param_slot_count + 1);
  if (!self->launches || !self->array_slots || !self->param_slots) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < self->launch_count; ++i) {
    Launch& to = self->launches[i];
    PyObject *function, *arguments;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(launches, i), "OIIIIIIIO", &function, &to.grid[0],
                          &to.grid[1], &to.grid[2], &to.block[0], &to.block[1], &to.block[2],
                          &to.shared_bytes, &arguments))
      return -1;
    to.function = as_pointer(function);
    to.arguments = static_cast<void**>(as_pointer(arguments));
  }
  for (Py_ssize_t i = 0; i < self->array_slot_count; ++i) {
    PyObject* slot;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(array_slots, i), "On", &slot,
                          &self->array_slots[i].index))
      return -1;
    self->array_slots[i].slot = static_cast<void**>(as_pointer(slot));
  }
  for (Py_ssize_t i = 0; i < self->param_slot_count; ++i) {
    PyObject* slot;
    int kind;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(param_slots, i), "OnC", &slot,
                          &self->param_slots[i].index, &kind))
      return -1;
    self->param_slots[i].slot = as_pointer(slot);
    self->param_slots[i].kind = static_cast<char>(kind);
  }
  return PyErr_Occurred() ? -1 : 0;
}

PyTypeObject WorkspaceType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Write a call's addresses and parameters into the argument blocks.
void write_slots(Workspace* workspace, void* const* addresses, PyObject* params) {
  for (Py_ssize_t i = 0; i < workspace->array_slot_count; ++i)
    *workspace->array_slots[i].slot = addresses[workspace->array_slots[i].index];
  for (Py_ssize_t i = 0; i < workspace->param_slot_count; ++i) {
    const ParamSlot& slot = workspace->param_slots[i];
    PyObject* value = PyTuple_GET_ITEM(params, slot.index);
    switch (slot.kind) {
      case 'f': *static_cast<float*>(slot.slot) = static_cast<float>(PyFloat_AS_DOUBLE(value)); break;
      case 'd': *static_cast<double*>(slot.slot) = PyFloat_AS_DOUBLE(value); break;
      case 'i': *static_cast<std::int32_t*>(slot.slot) = static_cast<std::int32_t>(PyLong_AsLongLong(value)); break;
      case 'q': *static_cast<std::int64_t*>(slot.slot) = PyLong_AsLongLong(value); break;
      case '?': *static_cast<bool*>(slot.slot) = value == Py_True; break;
    }
  }
}

// -- Hot: one compiled signature as the C path runs it ----------------------------------------

struct Hot {
  PyObject_HEAD
  PyObject* signature;       // the Python signature (workspaces, captures, errors)
  PyObject* stats;           // the pipeline's CacheStats
  PyObject* outputs;         // ((name, shape, dtype), ...)
  PyObject* allocate;        // (shape, dtype) -> (array, address)
  PyObject* current_device;  // () -> device, or None (the host)
  long device;
  PyObject* stream;          // () -> the caller's stream (an int), or None (the host)
  PyObject* workspaces;      // stream -> Workspace (made by signature.native_workspace)
  PyObject* signatures;      // the pipeline's signatures (an LRU)
  PyObject* key;             // this one's key there
  int capturable;            // replays CUDA graphs
};

int hot_traverse(Hot* self, visitproc visit, void* arg) {
  Py_VISIT(self->signature); Py_VISIT(self->stats); Py_VISIT(self->outputs);
  Py_VISIT(self->allocate); Py_VISIT(self->current_device); Py_VISIT(self->stream);
  Py_VISIT(self->workspaces); Py_VISIT(self->signatures); Py_VISIT(self->key);
  return 0;
}

int hot_clear(Hot* self) {
  Py_CLEAR(self->signature); Py_CLEAR(self->stats); Py_CLEAR(self->outputs);
  Py_CLEAR(self->allocate); Py_CLEAR(self->current_device); Py_CLEAR(self->stream);
  Py_CLEAR(self->workspaces); Py_CLEAR(self->signatures); Py_CLEAR(self->key);
  return 0;
}

void hot_dealloc(Hot* self) {
  PyObject_GC_UnTrack(self);
  hot_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int hot_init(Hot* self, PyObject* args, PyObject*) {
  PyObject *signature, *stats, *outputs, *allocate, *current_device, *stream, *workspaces,
      *signatures, *key;
  long device;
  int capturable;
  if (!PyArg_ParseTuple(args, "OOO!OOlOO!OOp", &signature, &stats, &PyTuple_Type, &outputs,
                        &allocate, &current_device, &device, &stream, &PyDict_Type,
                        &workspaces, &signatures, &key, &capturable))
    return -1;
  PyObject* given[] = {signature, stats, outputs, allocate, current_device, stream,
                       workspaces, signatures, key};
  PyObject** fields[] = {&self->signature, &self->stats, &self->outputs, &self->allocate,
                         &self->current_device, &self->stream, &self->workspaces,
                         &self->signatures, &self->key};
  for (int i = 0; i < 9; ++i) {
    Py_INCREF(given[i]);
    Py_XSETREF(*fields[i], given[i]);
  }
  self->device = device;
  self->capturable = capturable;
  return 0;
}

PyTypeObject HotType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* launch_failed(Hot* hot, Py_ssize_t index, int status) {
  PyObject* which = PyLong_FromSsize_t(index);
  PyObject* code = PyLong_FromLong(status);
  PyObject* raised = which && code ? PyObject_CallMethodObjArgs(hot->signature, s_launch_failed,
                                                                which, code, nullptr) : nullptr;
  Py_XDECREF(raised);
  Py_XDECREF(which);
  Py_XDECREF(code);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "kernel launch failed (%d)", status);
  return nullptr;
}

constexpr Py_ssize_t MAX_ARRAYS = 256;

// Run `hot` on a call's arrays: `addresses` holds the inputs' and has room for the outputs'.
// Returns the outputs by name, None where Python's path must take the call (before anything
// is done), or nullptr with an exception.
PyObject* hot_run(Hot* hot, void** addresses, Py_ssize_t input_count, PyObject* params) {
  if (hot->current_device != Py_None) {
    PyObject* device = PyObject_CallNoArgs(hot->current_device);
    if (device == nullptr) return nullptr;
    long current = PyLong_AsLong(device);
    Py_DECREF(device);
    if (current != hot->device) Py_RETURN_NONE;  // another device: Python switches to it
  }
  PyObject* stream = hot->stream == Py_None ? Py_NewRef(Py_None) : PyObject_CallNoArgs(hot->stream);
  if (stream == nullptr) return nullptr;
  void* stream_pointer = as_pointer(stream);
  PyObject* found = PyDict_GetItemWithError(hot->workspaces, stream);
  Workspace* workspace;
  if (found != nullptr) {
    workspace = reinterpret_cast<Workspace*>(Py_NewRef(found));
  } else if (PyErr_Occurred()) {
    Py_DECREF(stream);
    return nullptr;
  } else {
    PyObject* made = PyObject_CallMethodOneArg(hot->signature, s_native_workspace, stream);
    if (made != nullptr && !PyObject_TypeCheck(made, &WorkspaceType)) {
      PyErr_SetString(PyExc_TypeError, "native_workspace must return a Workspace");
      Py_CLEAR(made);
    }
    if (made == nullptr) { Py_DECREF(stream); return nullptr; }
    workspace = reinterpret_cast<Workspace*>(made);
  }
  PyObject* results = nullptr;
  PyObject* done = nullptr;
  int holding = 0;  // this call set workspace->busy
  results = PyDict_New();
  if (results == nullptr) goto finish;
  {
    Py_ssize_t output_count = PyTuple_GET_SIZE(hot->outputs);
    for (Py_ssize_t i = 0; i < output_count; ++i) {
      PyObject* output = PyTuple_GET_ITEM(hot->outputs, i);
      PyObject* made = PyObject_CallFunctionObjArgs(hot->allocate, PyTuple_GET_ITEM(output, 1),
                                                    PyTuple_GET_ITEM(output, 2), nullptr);
      if (made == nullptr) goto finish;
      addresses[input_count + i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(made, 1));
      int stored = PyDict_SetItem(results, PyTuple_GET_ITEM(output, 0), PyTuple_GET_ITEM(made, 0));
      Py_DECREF(made);
      if (stored < 0 || PyErr_Occurred()) goto finish;
    }
    Py_ssize_t array_count = input_count + output_count;
    // Another thread's call holds the workspace (it let the GIL go while its kernels
    // launch, or while Python captures a graph): Python launches this call on another.
    int aside = workspace->busy;
    if (!aside) workspace->busy = holding = 1;
    if (aside || hot->capturable || !workspace->direct) {
      PyObject* address_list = PyList_New(array_count);
      if (address_list == nullptr) goto finish;
      for (Py_ssize_t i = 0; i < array_count; ++i)
        PyList_SET_ITEM(address_list, i, PyLong_FromVoidPtr(addresses[i]));
      PyObject* graph = nullptr;
      if (hot->capturable && !aside) {
        PyObject* address_tuple = PyList_AsTuple(address_list);
        PyObject* graph_key = address_tuple ? PyTuple_Pack(2, address_tuple, params) : nullptr;
        Py_XDECREF(address_tuple);
        if (graph_key == nullptr) { Py_DECREF(address_list); goto finish; }
        graph = PyDict_GetItemWithError(workspace->graphs, graph_key);
        if (graph != nullptr) {  // replay
          Py_INCREF(graph);
          PyObject* moved = PyObject_CallMethodOneArg(workspace->graphs, s_move_to_end, graph_key);
          Py_XDECREF(moved);
          PyObject* exec = moved ? PyObject_GetAttr(graph, s_graph_exec) : nullptr;
          Py_DECREF(graph);
          int status = exec ? workspace->graph_launch(PyLong_AsVoidPtr(exec), stream_pointer) : 0;
          Py_XDECREF(exec);
          if (exec == nullptr || PyErr_Occurred() || status != 0 ||
              bump(hot->stats, s_graph_replays) < 0) {
            Py_DECREF(graph_key);
            Py_DECREF(address_list);
            if (!PyErr_Occurred()) launch_failed(hot, -1, status);
            goto finish;
          }
        }
        Py_DECREF(graph_key);
        if (graph == nullptr && PyErr_Occurred()) { Py_DECREF(address_list); goto finish; }
      }
      if (graph == nullptr) {  // Python launches (and captures, where it is time to)
        PyObject* launched;
        if (aside) {
          launched = PyObject_CallMethodObjArgs(hot->signature, s_launch_aside, results,
                                                address_list, params, stream, nullptr);
        } else {
          launched = PyObject_CallMethodObjArgs(hot->signature, s_native_launch,
                                                workspace->owner, results, address_list, params,
                                                stream, nullptr);
        }
        Py_DECREF(address_list);
        if (launched == nullptr) goto finish;
        Py_DECREF(launched);
      } else {
        Py_DECREF(address_list);
      }
    } else {
      write_slots(workspace, addresses, params);
      if (PyErr_Occurred()) goto finish;
      int status = 0;
      Py_ssize_t failed = 0;
      Py_BEGIN_ALLOW_THREADS
      for (Py_ssize_t i = 0; i < workspace->launch_count; ++i) {
        const Launch& launch = workspace->launches[i];
        status = workspace->launch(launch.function, launch.grid[0], launch.grid[1],
                                   launch.grid[2], launch.block[0], launch.block[1],
                                   launch.block[2], launch.shared_bytes, stream_pointer,
                                   launch.arguments, nullptr);
        if (status != 0) { failed = i; break; }
      }
      Py_END_ALLOW_THREADS
      if (status != 0) { launch_failed(hot, failed, status); goto finish; }
    }
  }
  if (bump(hot->stats, s_calls) < 0 || bump(hot->stats, s_hits) < 0 ||
      bump(hot->stats, s_native) < 0)
    goto finish;
  if (PyDict_Check(hot->signatures) && PyDict_GET_SIZE(hot->signatures) > 1) {
    PyObject* moved = PyObject_CallMethodOneArg(hot->signatures, s_move_to_end, hot->key);
    if (moved == nullptr) PyErr_Clear();  // let go by another thread meanwhile: it still ran
    Py_XDECREF(moved);
  }
  done = Py_NewRef(results);
finish:
  if (holding) workspace->busy = 0;
  Py_XDECREF(results);
  Py_DECREF(workspace);
  Py_DECREF(stream);
  return done;
}

// -- Dispatcher: a call's signature key, and its Hot ------------------------------------------

struct Dispatcher {
  PyObject_HEAD
  PyObject* graph_source;  // () -> the pipeline's graph, or None (the graph never changes)
  PyObject* graph;         // the graph this dispatcher was made for
  PyObject* inputs;        // input names (tuple of str), in the graph's order
  PyObject* params;        // ((name, check), ...) in the graph's order
  PyObject* kinds;         // array type -> ArrayKind
  PyObject* entries;       // key -> Hot
  double float32_limit;    // a float32 parameter's magnitude below which it stays finite
};

int dispatcher_traverse(Dispatcher* self, visitproc visit, void* arg) {
  Py_VISIT(self->graph_source); Py_VISIT(self->graph); Py_VISIT(self->inputs);
  Py_VISIT(self->params); Py_VISIT(self->kinds); Py_VISIT(self->entries);
  return 0;
}

int dispatcher_clear(Dispatcher* self) {
  Py_CLEAR(self->graph_source); Py_CLEAR(self->graph); Py_CLEAR(self->inputs);
  Py_CLEAR(self->params); Py_CLEAR(self->kinds); Py_CLEAR(self->entries);
  return 0;
}

void dispatcher_dealloc(Dispatcher* self) {
  PyObject_GC_UnTrack(self);
  dispatcher_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int dispatcher_init(Dispatcher* self, PyObject* args, PyObject*) {
  PyObject *graph_source, *graph, *inputs, *params, *kinds, *entries;
  if (!PyArg_ParseTuple(args, "OOO!O!O!O!d", &graph_source, &graph, &PyTuple_Type, &inputs,
                        &PyTuple_Type, &params, &PyDict_Type, &kinds, &PyDict_Type, &entries,
                        &self->float32_limit))
    return -1;
  if (PyTuple_GET_SIZE(inputs) + 1 > MAX_ARRAYS) {
    PyErr_SetString(PyExc_ValueError, "too many inputs for the C call path");
    return -1;
  }
  PyObject* given[] = {graph_source, graph, inputs, params, kinds, entries};
  PyObject** fields[] = {&self->graph_source, &self->graph, &self->inputs, &self->params,
                         &self->kinds, &self->entries};
  for (int i = 0; i < 6; ++i) {
    Py_INCREF(given[i]);
    Py_XSETREF(*fields[i], given[i]);
  }
  return 0;
}

// The lowest set bit of an address below VECTOR_ALIGNMENT (0: aligned), as the Python path's
// _alignment_bit.
long alignment_bit(std::uintptr_t address, Py_ssize_t ndim) {
  std::uintptr_t low = ndim ? address & (VECTOR_ALIGNMENT - 1) : 0;
  return static_cast<long>(low & (~low + 1));
}

// The key part of one array and its address: (type, dtype, shape, alignment bit, device).
// nullptr without an exception: not an array this path takes (not C-contiguous, unknown).
PyObject* describe(Dispatcher* self, PyObject* array, void** address) {
  PyObject* kind_object = PyDict_GetItemWithError(self->kinds, reinterpret_cast<PyObject*>(Py_TYPE(array)));
  if (kind_object == nullptr) return nullptr;
  long kind = PyLong_AsLong(kind_object);
  PyObject* shape = PyObject_GetAttr(array, s_shape);
  PyObject* dtype = shape ? PyObject_GetAttr(array, s_dtype) : nullptr;
  PyObject* device = nullptr;
  int contiguous = 0;
  if (dtype == nullptr) goto failed;
  if (kind == CUPY) {
    PyObject* flag = PyObject_GetAttr(array, s_c_contiguous);
    contiguous = flag == Py_True;
    Py_XDECREF(flag);
    PyObject* data = flag ? PyObject_GetAttr(array, s_data) : nullptr;
    PyObject* pointer = data ? PyObject_GetAttr(data, s_ptr) : nullptr;
    device = pointer ? PyObject_GetAttr(data, s_device_id) : nullptr;
    if (pointer) *address = PyLong_AsVoidPtr(pointer);
    Py_XDECREF(pointer);
    Py_XDECREF(data);
  } else if (kind == NUMPY) {
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_STRIDES) == 0) {
      contiguous = PyBuffer_IsContiguous(&view, 'C');
      *address = view.buf;
      PyBuffer_Release(&view);
      device = Py_NewRef(Py_None);
    }
  } else if (kind == TORCH) {
    PyObject* flag = PyObject_CallMethodNoArgs(array, s_is_contiguous);
    contiguous = flag == Py_True;
    Py_XDECREF(flag);
    PyObject* pointer = flag ? PyObject_CallMethodNoArgs(array, s_data_ptr) : nullptr;
    PyObject* where = pointer ? PyObject_GetAttr(array, s_device) : nullptr;
    PyObject* type = where ? PyObject_GetAttr(where, s_type) : nullptr;
    if (type != nullptr) {
      int on_gpu = PyUnicode_Compare(type, s_cuda) == 0;
      device = on_gpu ? PyObject_GetAttr(where, s_index) : Py_NewRef(Py_None);
    }
    if (pointer) *address = PyLong_AsVoidPtr(pointer);
    Py_XDECREF(type); Py_XDECREF(where); Py_XDECREF(pointer);
  }
  if (device == nullptr || !contiguous || PyErr_Occurred()) goto failed;
  {
    Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : PyObject_Length(shape);
    PyObject* bit = PyLong_FromLong(alignment_bit(reinterpret_cast<std::uintptr_t>(*address), ndim));
    PyObject* key = bit ? PyTuple_Pack(5, reinterpret_cast<PyObject*>(Py_TYPE(array)), dtype,
                                       shape, bit, device) : nullptr;
    Py_XDECREF(bit);
    Py_DECREF(shape); Py_DECREF(dtype); Py_DECREF(device);
    if (key == nullptr) PyErr_Clear();
    return key;
  }
failed:
  PyErr_Clear();  // whatever it was, Python's path describes the array again and says
  Py_XDECREF(shape); Py_XDECREF(dtype); Py_XDECREF(device);
  return nullptr;
}

// Whether `value` is a parameter this path passes as it is (Python's param_value would return
// it unchanged).
bool plain_param(Dispatcher* self, PyObject* value, char check) {
  switch (check) {
    case FLOAT64: return PyFloat_CheckExact(value);
    case FLOAT32: {
      if (!PyFloat_CheckExact(value)) return false;
      double number = PyFloat_AS_DOUBLE(value);
      return -self->float32_limit < number && number < self->float32_limit;
    }
    case INT32:
    case INT64: {
      if (!PyLong_CheckExact(value)) return false;
      int overflow = 0;
      long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
      if (overflow || (number == -1 && PyErr_Occurred())) { PyErr_Clear(); return false; }
      if (check == INT32) return number >= INT32_MIN && number <= INT32_MAX;
      return number > -(1LL << 53) && number < (1LL << 53);  // exact as a float too
    }
    case BOOL: return PyBool_Check(value);
    default: return false;
  }
}

// The call's key, its addresses and its parameters; nullptr without an exception where this
// path does not take the call.
PyObject* call_key(Dispatcher* self, PyObject* given, void** addresses, PyObject** params_out) {
  if (!PyDict_Check(given)) return nullptr;
  if (self->graph_source != Py_None) {
    PyObject* graph = PyObject_CallNoArgs(self->graph_source);
    if (graph == nullptr) { PyErr_Clear(); return nullptr; }
    bool same = graph == self->graph;
    Py_DECREF(graph);
    if (!same) return nullptr;
  }
  Py_ssize_t input_count = PyTuple_GET_SIZE(self->inputs);
  Py_ssize_t param_count = PyTuple_GET_SIZE(self->params);
  if (PyDict_GET_SIZE(given) != input_count + param_count) return nullptr;
  PyObject* key = PyTuple_New(input_count + param_count);
  PyObject* params = PyTuple_New(param_count);
  if (key == nullptr || params == nullptr) goto failed;
  for (Py_ssize_t i = 0; i < input_count; ++i) {
    PyObject* array = PyDict_GetItemWithError(given, PyTuple_GET_ITEM(self->inputs, i));
    PyObject* part = array ? describe(self, array, &addresses[i]) : nullptr;
    if (part == nullptr) goto failed;
    PyTuple_SET_ITEM(key, i, part);
  }
  for (Py_ssize_t i = 0; i < param_count; ++i) {
    PyObject* spec = PyTuple_GET_ITEM(self->params, i);
    PyObject* value = PyDict_GetItemWithError(given, PyTuple_GET_ITEM(spec, 0));
    if (value == nullptr) goto failed;
    const char* check = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 1));
    if (check == nullptr || !plain_param(self, value, check[0])) goto failed;
    PyTuple_SET_ITEM(key, input_count + i, Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(value))));
    PyTuple_SET_ITEM(params, i, Py_NewRef(value));
  }
  *params_out = params;
  return key;
failed:
  PyErr_Clear();
  Py_XDECREF(key);
  Py_XDECREF(params);
  return nullptr;
}

// dispatcher.key(given): the key a Hot for this call is kept under, or None.
PyObject* dispatcher_key(Dispatcher* self, PyObject* given) {
  void* addresses[MAX_ARRAYS];
  PyObject* params = nullptr;
  PyObject* key = call_key(self, given, addresses, &params);
  if (key == nullptr) Py_RETURN_NONE;
  Py_DECREF(params);
  return key;
}

// dispatcher(given): the outputs by name, or None (Python's path takes the call).
PyObject* dispatcher_call(Dispatcher* self, PyObject* args, PyObject*) {
  PyObject* given;
  if (!PyArg_ParseTuple(args, "O", &given)) return nullptr;
  void* addresses[MAX_ARRAYS];
  PyObject* params = nullptr;
  PyObject* key = call_key(self, given, addresses, &params);
  if (key == nullptr) Py_RETURN_NONE;
  PyObject* hot = PyDict_GetItemWithError(self->entries, key);
  Py_DECREF(key);
  if (hot == nullptr) {
    Py_DECREF(params);
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  Py_INCREF(hot);
  Hot* entry = reinterpret_cast<Hot*>(hot);
  PyObject* result = nullptr;
  if (PyTuple_GET_SIZE(self->inputs) + PyTuple_GET_SIZE(entry->outputs) > MAX_ARRAYS)
    result = Py_NewRef(Py_None);
  else
    result = hot_run(entry, addresses, PyTuple_GET_SIZE(self->inputs), params);
  Py_DECREF(hot);
  Py_DECREF(params);
  return result;
}

PyMethodDef dispatcher_methods[] = {
    {"key", reinterpret_cast<PyCFunction>(dispatcher_key), METH_O,
     "The key a signature's Hot is kept under for this call's arguments (None: this path "
     "does not take such a call)."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject DispatcherType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* host_launch_address(PyObject*, PyObject*) {
  return PyLong_FromVoidPtr(reinterpret_cast<void*>(&kf_host_launch));
}

PyMethodDef module_methods[] = {
    {"host_launch_address", host_launch_address, METH_NOARGS,
     "The address of the cpu backend's launch function (cuLaunchKernel's signature)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kfuse_dispatch",
                      "kfuse's call path in C (kfuse.runtime.native).", -1, module_methods};

bool ready_type(PyTypeObject* type, const char* name, Py_ssize_t size, destructor dealloc,
                traverseproc traverse, inquiry clear, initproc init, ternaryfunc call,
                PyMethodDef* methods) {
  type->tp_name = name;
  type->tp_basicsize = size;
  type->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;  // they hold cycles: a Hot holds
  type->tp_traverse = traverse;                             // its signature, which holds
  type->tp_clear = clear;                                   // the pipeline, which holds them
  type->tp_new = PyType_GenericNew;
  type->tp_dealloc = dealloc;
  type->tp_init = init;
  type->tp_call = call;
  type->tp_methods = methods;
  return PyType_Ready(type) == 0;
}

}  // namespace

PyMODINIT_FUNC PyInit__kfuse_dispatch(void) {
  const char* names[] = {"shape", "dtype", "_c_contiguous", "data", "ptr", "device_id",
                         "data_ptr", "is_contiguous", "device", "index", "type", "cuda",
                         "graphExec", "move_to_end", "calls", "hits", "native",
                         "graph_replays", "native_workspace", "native_launch",
                         "launch_failed", "launch_aside"};
  PyObject** interned[] = {&s_shape, &s_dtype, &s_c_contiguous, &s_data, &s_ptr, &s_device_id,
                           &s_data_ptr, &s_is_contiguous, &s_device, &s_index, &s_type, &s_cuda,
                           &s_graph_exec, &s_move_to_end, &s_calls, &s_hits, &s_native,
                           &s_graph_replays, &s_native_workspace, &s_native_launch,
                           &s_launch_failed, &s_launch_aside};
  if ((one = PyLong_FromLong(1)) == nullptr) return nullptr;
  for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
    if ((*interned[i] = PyUnicode_InternFromString(names[i])) == nullptr) return nullptr;
  if (!ready_type(&WorkspaceType, "_kfuse_dispatch.Workspace", sizeof(Workspace),
                  reinterpret_cast<destructor>(workspace_dealloc),
                  reinterpret_cast<traverseproc>(workspace_traverse),
                  reinterpret_cast<inquiry>(workspace_clear),
                  reinterpret_cast<initproc>(workspace_init), nullptr, nullptr) ||
      !ready_type(&HotType, "_kfuse_dispatch.Hot", sizeof(Hot),
                  reinterpret_cast<destructor>(hot_dealloc),
                  reinterpret_cast<traverseproc>(hot_traverse), reinterpret_cast<inquiry>(hot_clear),
                  reinterpret_cast<initproc>(hot_init),
                  nullptr, nullptr) ||
      !ready_type(&DispatcherType, "_kfuse_dispatch.Dispatcher", sizeof(Dispatcher),
                  reinterpret_cast<destructor>(dispatcher_dealloc),
                  reinterpret_cast<traverseproc>(dispatcher_traverse),
                  reinterpret_cast<inquiry>(dispatcher_clear),
                  reinterpret_cast<initproc>(dispatcher_init),
                  reinterpret_cast<ternaryfunc>(dispatcher_call), dispatcher_methods))
    return nullptr;
  PyObject* created = PyModule_Create(&module);
  if (created == nullptr) return nullptr;
  PyTypeObject* types[] = {&WorkspaceType, &HotType, &DispatcherType};
  const char* type_names[] = {"Workspace", "Hot", "Dispatcher"};
  for (int i = 0; i < 3; ++i) {
    Py_INCREF(types[i]);
    if (PyModule_AddObject(created, type_names[i], reinterpret_cast<PyObject*>(types[i])) < 0)
      return nullptr;
  }
  return created;
}
