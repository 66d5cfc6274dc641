"""Compiles an extension's sources in parallel. setuptools runs one compiler process
at a time (build_ext -j only spreads separate extensions, and the core is one), so
the core's ~50 sources took twice as long as needed on 2 cores."""
from concurrent.futures import ThreadPoolExecutor


def compile_in_parallel(compiler, jobs):
    """Makes compiler.compile() run up to `jobs` compiler processes at once. It is
    CCompiler.compile() with its loop over objects in a thread pool; _setup_compile
    has made every output folder before any compile starts."""

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            # list(): waits for all, and raises the first CompileError.
            list(pool.map(one, [obj for obj in objects if obj in build]))
        return objects

    compiler.compile = compile
