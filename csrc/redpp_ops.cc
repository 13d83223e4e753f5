// The onnxruntime custom-op library: RegisterCustomOps is the one place that lists kernels.
//
// Load it with SessionOptions.register_custom_ops_library(path) (Python),
// Ort::SessionOptions::RegisterCustomOpsLibrary (C++) or OrtApi::RegisterCustomOpsLibrary_V2
// (C); redpp_onnx.get_library_path() gives the path. The library needs onnxruntime >= 1.29
// (C API version 29) and links to neither onnxruntime nor Python.
//
// Errors never cross the C ABI as exceptions: the kernel uses the status-returning
// CreateKernelV2 / KernelComputeV2 entry points and turns every failure into an OrtStatus.
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#include "split_conv.h"
#include "split_conv_contract.h"

namespace redpp {
namespace {

namespace k = contract;

// Attributes, read through the C API so that "absent" is not an exception. The C API has no
// call that gives an attribute's type from an OrtKernelInfo, and its array getters do not all
// check the type (an ints getter may return an empty list for a FLOATS attribute): the type is
// found by asking each typed getter in turn, scalars (which check the type) first.
enum class AttrKind { kAbsent, kInt, kInts, kFloat, kFloats, kString, kStrings, kTensor, kEmptyList };

const char* KindName(AttrKind kind) {
  switch (kind) {
    case AttrKind::kAbsent: return "absent";
    case AttrKind::kInt: return "int";
    case AttrKind::kInts: return "ints";
    case AttrKind::kFloat: return "float";
    case AttrKind::kFloats: return "floats";
    case AttrKind::kString: return "string";
    case AttrKind::kStrings: return "strings";
    case AttrKind::kTensor: return "tensor";
    case AttrKind::kEmptyList: return "an empty list";
  }
  return "?";
}

// True when `st` is success; releases it otherwise.
bool Ok(const OrtApi& api, OrtStatus* st) {
  if (st == nullptr) return true;
  api.ReleaseStatus(st);
  return false;
}

AttrKind ProbeAttr(const OrtApi& api, const OrtKernelInfo* info, const char* name) {
  float f = 0.f;
  int64_t i = 0;
  size_t size = 0;
  if (Ok(api, api.KernelInfoGetAttribute_float(info, name, &f))) return AttrKind::kFloat;
  if (Ok(api, api.KernelInfoGetAttribute_int64(info, name, &i))) return AttrKind::kInt;
  if (Ok(api, api.KernelInfoGetAttribute_string(info, name, nullptr, &size))) return AttrKind::kString;
  size_t n_ints = 0, n_floats = 0, n_strings = 0;
  const bool ints = Ok(api, api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &n_ints));
  const bool floats = Ok(api, api.KernelInfoGetAttributeArray_float(info, name, nullptr, &n_floats));
  if (ints && n_ints > 0) return AttrKind::kInts;
  if (floats && n_floats > 0) return AttrKind::kFloats;
  OrtAllocator* alloc = nullptr;
  if (Ok(api, api.GetAllocatorWithDefaultOptions(&alloc))) {
    if (Ok(api, api.KernelInfoGetAttributeArray_string(info, name, alloc, nullptr, &n_strings)) && n_strings > 0)
      return AttrKind::kStrings;
    OrtValue* tensor = nullptr;
    if (Ok(api, api.KernelInfoGetAttribute_tensor(info, name, alloc, &tensor))) {
      if (tensor) api.ReleaseValue(tensor);
      return AttrKind::kTensor;
    }
  }
  return ints || floats ? AttrKind::kEmptyList : AttrKind::kAbsent;
}

// The contract's kind of each attribute ("ints", "string", "float": contract::kAttrKind).
AttrKind ContractKind(const char* kind) {
  const std::string k(kind);
  return k == "ints" ? AttrKind::kInts : k == "string" ? AttrKind::kString : AttrKind::kFloat;
}

// Every attribute of the contract has its declared type (an ints attribute is a non-empty list)
// or is absent, and no refused Conv attribute is present. Empty when the node is valid.
std::string CheckAttributeTypes(const OrtApi& api, const OrtKernelInfo* info) {
  for (size_t a = 0; a < k::kNumAttrs; ++a) {
    const AttrKind want = ContractKind(k::kAttrKind[a]);
    const AttrKind got = ProbeAttr(api, info, k::kAttrName[a]);
    if (got != AttrKind::kAbsent && got != want)
      return std::string("SplitConv: attribute '") + k::kAttrName[a] + "' must be of type " + k::kAttrKind[a] +
             (want == AttrKind::kInts ? " (a non-empty list of integers; omit it for the default)" : "") +
             ", got " + KindName(got);
  }
  for (size_t a = 0; a < k::kNumRefusedAttrs; ++a)
    if (ProbeAttr(api, info, k::kRefusedAttrName[a]) != AttrKind::kAbsent)
      return std::string("SplitConv: attribute '") + k::kRefusedAttrName[a] +
             "' is not a SplitConv attribute (Conv's auto_pad, group and kernel_shape are not supported: "
             "give explicit pads; SplitConv is group 1 with the kernel shape of its kernels input)";
  return {};
}

// Reads an attribute whose type CheckAttributeTypes has confirmed (false: absent).
bool TryGetInts(const OrtApi& api, const OrtKernelInfo* info, const char* name, std::vector<int64_t>* out) {
  size_t size = 0;
  if (!Ok(api, api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size))) return false;
  out->assign(size, 0);
  if (size == 0) return true;
  return Ok(api, api.KernelInfoGetAttributeArray_int64(info, name, out->data(), &size));
}

bool TryGetFloat(const OrtApi& api, const OrtKernelInfo* info, const char* name, float* out) {
  return Ok(api, api.KernelInfoGetAttribute_float(info, name, out));
}

bool TryGetString(const OrtApi& api, const OrtKernelInfo* info, const char* name, std::string* out) {
  size_t size = 0;
  if (!Ok(api, api.KernelInfoGetAttribute_string(info, name, nullptr, &size))) return false;
  std::string s(size, '\0');  // size includes the terminating NUL
  if (!Ok(api, api.KernelInfoGetAttribute_string(info, name, s.data(), &size))) return false;
  s.resize(size > 0 ? size - 1 : 0);
  *out = s;
  return true;
}

bool TypeAllowed(size_t input, int type) {
  for (int t : k::kInputElemTypes[input])
    if (t == type && t != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) return true;
  return false;
}

IndexView IndexOf(const Ort::ConstValue& v) {
  IndexView t;
  auto info = v.GetTensorTypeAndShapeInfo();
  t.shape = info.GetShape();
  t.elem_type = static_cast<int>(info.GetElementType());
  t.data = v.GetTensorRawData();
  t.given = true;
  return t;
}

template <typename T>
TensorView<T> ViewOf(const Ort::ConstValue& v) {
  TensorView<T> t;
  auto info = v.GetTensorTypeAndShapeInfo();
  t.shape = info.GetShape();
  t.data = v.GetTensorData<T>();
  t.given = true;
  return t;
}

struct ParallelTask {
  const SplitConvInputs* in;
  const SplitConvAttrs* attrs;
  const WeightPlan* weights;
  const ConvPlan* plan;
  float* y;
  std::atomic<bool> failed{false};
};

void RunTask(void* data, size_t task) {
  auto* t = static_cast<ParallelTask*>(data);
  if (!RunSplitConvTask(*t->in, *t->attrs, *t->weights, *t->plan, t->y, task)) t->failed.store(true);
}

// The weight inputs (kernels, offsets, idx) when all three are constant initializers.
struct ConstantWeights {
  TensorView<float> kernels;
  TensorView<int64_t> offsets;
  IndexView idx;
};

bool GetConstantWeights(const OrtApi& api, const OrtKernelInfo* info, ConstantWeights* out) {
  const size_t indices[] = {k::kInput_kernels, k::kInput_offsets, k::kInput_idx};
  const OrtValue* values[3] = {};
  for (int i = 0; i < 3; ++i) {
    int is_constant = 0;
    if (OrtStatus* st = api.KernelInfoGetConstantInput_tensor(info, indices[i], &is_constant, &values[i])) {
      api.ReleaseStatus(st);
      return false;
    }
    if (!is_constant || values[i] == nullptr) return false;
    auto type = Ort::ConstValue(values[i]).GetTensorTypeAndShapeInfo().GetElementType();
    if (!TypeAllowed(indices[i], static_cast<int>(type))) return false;  // reported at run time
  }
  out->kernels = ViewOf<float>(Ort::ConstValue(values[0]));
  out->offsets = ViewOf<int64_t>(Ort::ConstValue(values[1]));
  out->idx = IndexOf(Ort::ConstValue(values[2]));
  return true;
}

struct SplitConvKernel {
  SplitConvKernel(const OrtApi& api, SplitConvAttrs attrs) : api_(api), attrs_(std::move(attrs)) {}

  // With constant weights the weight plan is built (and validated) once, here.
  std::string CacheWeights(const ConstantWeights& w) {
    cached_kernels_ = w.kernels.data;
    cached_offsets_ = w.offsets.data;
    cached_idx_ = w.idx.data;
    std::string err = PlanWeights(w.kernels, w.offsets, w.idx, &cached_);
    has_cached_ = err.empty();
    return err;
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) noexcept {
    try {
      return Compute(context);
    } catch (const Ort::Exception& e) {
      return api_.CreateStatus(e.GetOrtErrorCode(), e.what());
    } catch (const std::bad_alloc&) {
      return api_.CreateStatus(ORT_FAIL, "SplitConv: out of memory");
    } catch (const std::exception& e) {
      return api_.CreateStatus(ORT_FAIL, (std::string("SplitConv: ") + e.what()).c_str());
    } catch (...) {
      return api_.CreateStatus(ORT_FAIL, "SplitConv: unknown error");
    }
  }

 private:
  OrtStatusPtr Invalid(const std::string& msg) const { return api_.CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

  OrtStatusPtr Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const size_t count = ctx.GetInputCount();
    Ort::ConstValue values[k::kNumInputs];
    for (size_t i = 0; i < k::kNumInputs && i < count; ++i) {
      values[i] = ctx.GetInput(i);
      if (!values[i]) continue;  // an omitted optional input
      if (!values[i].IsTensor()) return Invalid(std::string("SplitConv: input ") + k::kInputName[i] + " must be a tensor");
      const auto type = values[i].GetTensorTypeAndShapeInfo().GetElementType();
      if (!TypeAllowed(i, static_cast<int>(type)))
        return Invalid(std::string("SplitConv: input ") + k::kInputName[i] + " has element type " +
                       std::to_string(static_cast<int>(type)) + ", which the contract does not allow" +
                       (i == k::kInput_idx ? " (idx: int8, int16 or int32)" : ""));
    }
    for (size_t i = 0; i < k::kNumInputs; ++i)
      if (!k::kInputOptional[i] && (i >= count || !values[i]))
        return Invalid(std::string("SplitConv: required input ") + k::kInputName[i] + " is missing");

    SplitConvInputs in;
    in.x = ViewOf<float>(values[k::kInput_X]);
    in.kernels = ViewOf<float>(values[k::kInput_kernels]);
    in.offsets = ViewOf<int64_t>(values[k::kInput_offsets]);
    in.idx = IndexOf(values[k::kInput_idx]);
    if (values[k::kInput_B]) in.bias = ViewOf<float>(values[k::kInput_B]);
    if (values[k::kInput_scale]) in.scale = ViewOf<float>(values[k::kInput_scale]);
    if (values[k::kInput_shift]) in.shift = ViewOf<float>(values[k::kInput_shift]);

    // The cached plan applies when the constant weights are the tensors we are given.
    WeightPlan local;
    const WeightPlan* weights = &cached_;
    if (!(has_cached_ && in.kernels.data == cached_kernels_ && in.offsets.data == cached_offsets_ &&
          in.idx.data == cached_idx_ && in.kernels.shape.size() == cached_.kernel_shape.size() + 1)) {
      if (std::string err = PlanWeights(in.kernels, in.offsets, in.idx, &local); !err.empty()) return Invalid(err);
      weights = &local;
    }
    ConvPlan plan;
    if (std::string err = PlanConv(in, attrs_, *weights, &plan); !err.empty()) return Invalid(err);
    auto out = ctx.GetOutput(0, plan.out_shape.data(), plan.out_shape.size());
    if (plan.num_tasks() == 0) return nullptr;
    ParallelTask task{&in, &attrs_, weights, &plan, out.GetTensorMutableData<float>()};
    ctx.ParallelFor(&RunTask, plan.num_tasks(), 0, &task);
    if (task.failed.load()) return api_.CreateStatus(ORT_FAIL, "SplitConv: out of memory for scratch buffers");
    return nullptr;
  }

  const OrtApi& api_;
  const SplitConvAttrs attrs_;
  bool has_cached_ = false;
  WeightPlan cached_;
  const void *cached_kernels_ = nullptr, *cached_offsets_ = nullptr, *cached_idx_ = nullptr;
};

struct SplitConvOp : Ort::CustomOpBase<SplitConvOp, SplitConvKernel, /*WithStatus=*/true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** op_kernel) const noexcept {
    try {
      if (std::string err = CheckAttributeTypes(api, info); !err.empty())
        return api.CreateStatus(ORT_INVALID_ARGUMENT, err.c_str());
      SplitConvAttrs attrs;
      TryGetInts(api, info, k::kAttr_strides, &attrs.strides);
      TryGetInts(api, info, k::kAttr_pads, &attrs.pads);
      TryGetInts(api, info, k::kAttr_dilations, &attrs.dilations);
      std::string act;
      TryGetString(api, info, k::kAttr_activation, &act);
      attrs.activation = -1;
      for (int code = 0; code < k::kNumActivations; ++code)
        if (act == k::kActivationName[code]) attrs.activation = code;
      if (attrs.activation < 0)
        return api.CreateStatus(ORT_INVALID_ARGUMENT,
                                ("SplitConv: unknown activation '" + act + "' (use '', 'Relu' or 'Clip')").c_str());
      TryGetFloat(api, info, k::kAttr_clip_min, &attrs.clip_min);
      TryGetFloat(api, info, k::kAttr_clip_max, &attrs.clip_max);
      if (std::string err = ValidateAttrs(attrs); !err.empty())
        return api.CreateStatus(ORT_INVALID_ARGUMENT, err.c_str());
      auto kernel = std::make_unique<SplitConvKernel>(api, std::move(attrs));
      ConstantWeights weights;
      if (GetConstantWeights(api, info, &weights))
        if (std::string err = kernel->CacheWeights(weights); !err.empty())
          return api.CreateStatus(ORT_INVALID_ARGUMENT, err.c_str());
      *op_kernel = kernel.release();
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_FAIL, (std::string("SplitConv: ") + e.what()).c_str());
    } catch (...) {
      return api.CreateStatus(ORT_FAIL, "SplitConv: unknown error at kernel creation");
    }
  }

  const char* GetName() const { return k::kOpType; }
  size_t GetInputTypeCount() const { return k::kNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return static_cast<ONNXTensorElementDataType>(k::kInputElemType[i]);
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return k::kInputOptional[i] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return k::kNumOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

// A domain must outlive every session created with it, and onnxruntime gives no signal when
// the last one is gone: like onnxruntime's own examples, keep them for the life of the process
// (one small object per registration).
std::mutex g_domains_mutex;
std::vector<OrtCustomOpDomain*> g_domains;

}  // namespace
}  // namespace redpp

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string msg = std::string("redpp-onnx custom ops need onnxruntime C API version ") +
                            std::to_string(ORT_API_VERSION) + " (onnxruntime >= 1." +
                            std::to_string(ORT_API_VERSION) + "); this onnxruntime is " +
                            api_base->GetVersionString();
    return v1->CreateStatus(ORT_FAIL, msg.c_str());
  }
  Ort::InitApi(api);
  static const redpp::SplitConvOp split_conv;
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* st = api->CreateCustomOpDomain(redpp::contract::kDomain, &domain)) return st;
  {
    std::lock_guard<std::mutex> lock(redpp::g_domains_mutex);
    redpp::g_domains.push_back(domain);
  }
  if (OrtStatus* st = api->CustomOpDomain_Add(domain, &split_conv)) return st;
  return api->AddCustomOpDomain(options, domain);
}
