"""The instruction words of a cubin's kernels, for the SASS-reading scripts
(bench/random_sass.sh, bench/copy_shapes_sass.sh) on machines without cuobjdump."""
import struct


def kernels(path):
    """Kernel name -> [(address, low 64 bits, high 64 bits)] of each 128-bit sm_90
    instruction, from the cubin's .text sections (an ELF file)."""
    data = open(path, "rb").read()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
               for i in range(shnum)]
    names = headers[shstrndx][4]
    result = {}
    for h in headers:
        name = data[names + h[0]:data.index(b"\0", names + h[0])].decode()
        if name.startswith(".text."):
            body = data[h[4]:h[4] + h[5]]
            result[name[len(".text."):]] = [
                (at,) + struct.unpack_from("<QQ", body, at) for at in range(0, len(body), 16)]
    return result
