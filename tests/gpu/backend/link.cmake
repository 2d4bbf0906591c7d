# The graph test drives capture and replay through the CUDA runtime directly.
target_link_libraries(${target} PRIVATE CUDA::cudart_static)
