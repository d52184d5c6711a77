"""The ReFrame `logging` section every site profile shares (imported by their settings.py).

One file per test under <prefix>/perflogs/<system>/<partition>/, one line per performance
variable: completion time, result, test, environment, config, seed, variable, value,
unit, reference, lower and upper thresholds, verdict, node list ('|'-separated; ReFrame
writes the format as the file's first line, which `hpckit report` reads).
"""

PERFLOG_FORMAT = ('%(check_job_completion_time)s|%(check_result)s|'
                  '%(check_display_name)s|%(check_environ)s|'
                  '%(check_config)s|%(check_seed)s|%(check_perf_var)s|'
                  '%(check_perf_value)s|%(check_perf_unit)s|'
                  '%(check_perf_ref)s|%(check_perf_lower_thres)s|'
                  '%(check_perf_upper_thres)s|%(check_perf_result)s|'
                  '%(check_job_nodelist)s')

LOGGING = [
    {
        'handlers$': [
            {'type': 'stream', 'name': 'stdout', 'level': 'info', 'format': '%(message)s'},
        ],
        'handlers': [
            {'type': 'file', 'level': 'debug2', 'append': False,
             'format': '[%(asctime)s] %(levelname)s: %(check_info)s: %(message)s'},
        ],
        'perflog_multiline': True,
        'handlers_perflog': [
            {'type': 'filelog', 'prefix': '%(check_system)s/%(check_partition)s',
             'level': 'info', 'append': True, 'format': PERFLOG_FORMAT},
        ],
    },
]
