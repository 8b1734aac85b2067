import json, statistics as st, sys
B='bench/results/h100-2026-11-22d/'
calls=['bench-call1-native','bench-call2-cudaMallocAsync']
ds=[json.load(open(B+c+'/bench_gpu.json')) for c in calls]
def rows(d,part,key='results'):
    return d['parts'].get(part,{}).get(key,[]) or []
print("== speed (decode ms/frame, e2e ms/frame, e2e peak GiB, kernels/frame, gpu us/frame, codec ms/frame)")
names=[r['stack'] for r in rows(ds[0],'speed')]
for n in names:
    vals=[]
    for d in ds:
        r=next((r for r in rows(d,'speed') if r['stack']==n),None)
        vals.append(None if r is None else (r['ms_per_frame'],r['end_to_end_ms_per_frame'],r.get('end_to_end_peak_memory_gib'),r.get('kernels_per_frame'),r.get('gpu_kernel_us_per_frame'),r.get('codec_decode_ms_per_frame')))
    print(n, vals)
print("== faster")
for d in ds:
    for r in rows(d,'faster'): print({k:r.get(k) for k in ('stack','ms_per_frame','end_to_end_ms_per_frame','capture_or_compile_s')})
print("== batch")
for d in ds:
    for r in rows(d,'batch'): print({k:r.get(k) for k in r if k not in ('runs_s','lines','per_line')})
print("== faster_batch")
for d in ds:
    print(d['parts'].get('faster_batch'))
print("== first_call")
for d in ds:
    print(json.dumps(d['parts'].get('first_call',{}).get('first_call'))[:1500])
