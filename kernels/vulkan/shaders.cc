#include "kernels/vulkan/shaders.h"

namespace kvlab::vulkan {

namespace {

// kvlab_vk_<stem>_small / _words for every shader of KVLAB_VK_SHADERS: glslc -mfmt=c
// output, brace-enclosed word lists, embedded by a table that kernels/vulkan/CMakeLists.txt
// writes from the same list (an #include cannot come out of a macro).
#include "kvlab_vk_spirv_table.inc"

template <std::size_t Small, std::size_t Words>
std::span<const std::uint32_t> pick(bool small_storage, const std::uint32_t (&small)[Small],
                                    const std::uint32_t (&words)[Words]) {
  return small_storage ? std::span<const std::uint32_t>(small) : std::span<const std::uint32_t>(words);
}

}  // namespace

std::string_view shader_name(ShaderId id) {
  switch (id) {
#define KVLAB_VK_SHADER_NAME(id, stem) \
  case ShaderId::id: return #id;
    KVLAB_VK_SHADERS(KVLAB_VK_SHADER_NAME)
#undef KVLAB_VK_SHADER_NAME
  }
  return "?";
}

std::span<const std::uint32_t> shader_spirv(ShaderId id, bool small_storage) {
  switch (id) {
#define KVLAB_VK_SHADER_SPIRV(id, stem) \
  case ShaderId::id: return pick(small_storage, kvlab_vk_##stem##_small, kvlab_vk_##stem##_words);
    KVLAB_VK_SHADERS(KVLAB_VK_SHADER_SPIRV)
#undef KVLAB_VK_SHADER_SPIRV
  }
  return {};
}

}  // namespace kvlab::vulkan
