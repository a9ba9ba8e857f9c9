package dev.snowkeep.v1;

import static io.grpc.MethodDescriptor.generateFullMethodName;

/**
 * <pre>
 * Issues ascending snowflake ids from the machine ids this server holds.
 * </pre>
 */
@io.grpc.stub.annotations.GrpcGenerated
public final class IdServiceGrpc {

  private IdServiceGrpc() {}

  public static final java.lang.String SERVICE_NAME = "snowkeep.v1.IdService";

  // Static method descriptors that strictly reflect the proto.
  private static volatile io.grpc.MethodDescriptor<dev.snowkeep.v1.NextIdsRequest,
      dev.snowkeep.v1.NextIdsResponse> getNextIdsMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "NextIds",
      requestType = dev.snowkeep.v1.NextIdsRequest.class,
      responseType = dev.snowkeep.v1.NextIdsResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dev.snowkeep.v1.NextIdsRequest,
      dev.snowkeep.v1.NextIdsResponse> getNextIdsMethod() {
    io.grpc.MethodDescriptor<dev.snowkeep.v1.NextIdsRequest, dev.snowkeep.v1.NextIdsResponse> getNextIdsMethod;
    if ((getNextIdsMethod = IdServiceGrpc.getNextIdsMethod) == null) {
      synchronized (IdServiceGrpc.class) {
        if ((getNextIdsMethod = IdServiceGrpc.getNextIdsMethod) == null) {
          IdServiceGrpc.getNextIdsMethod = getNextIdsMethod =
              io.grpc.MethodDescriptor.<dev.snowkeep.v1.NextIdsRequest, dev.snowkeep.v1.NextIdsResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "NextIds"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.NextIdsRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.NextIdsResponse.getDefaultInstance()))
              .setSchemaDescriptor(new IdServiceMethodDescriptorSupplier("NextIds"))
              .build();
        }
      }
    }
    return getNextIdsMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dev.snowkeep.v1.StreamIdsRequest,
      dev.snowkeep.v1.IdBatch> getStreamIdsMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "StreamIds",
      requestType = dev.snowkeep.v1.StreamIdsRequest.class,
      responseType = dev.snowkeep.v1.IdBatch.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<dev.snowkeep.v1.StreamIdsRequest,
      dev.snowkeep.v1.IdBatch> getStreamIdsMethod() {
    io.grpc.MethodDescriptor<dev.snowkeep.v1.StreamIdsRequest, dev.snowkeep.v1.IdBatch> getStreamIdsMethod;
    if ((getStreamIdsMethod = IdServiceGrpc.getStreamIdsMethod) == null) {
      synchronized (IdServiceGrpc.class) {
        if ((getStreamIdsMethod = IdServiceGrpc.getStreamIdsMethod) == null) {
          IdServiceGrpc.getStreamIdsMethod = getStreamIdsMethod =
              io.grpc.MethodDescriptor.<dev.snowkeep.v1.StreamIdsRequest, dev.snowkeep.v1.IdBatch>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "StreamIds"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.StreamIdsRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.IdBatch.getDefaultInstance()))
              .setSchemaDescriptor(new IdServiceMethodDescriptorSupplier("StreamIds"))
              .build();
        }
      }
    }
    return getStreamIdsMethod;
  }

  /**
   * Creates a new async stub that supports all call types for the service
   */
  public static IdServiceStub newStub(io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<IdServiceStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<IdServiceStub>() {
        @java.lang.Override
        public IdServiceStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new IdServiceStub(channel, callOptions);
        }
      };
    return IdServiceStub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports all types of calls on the service
   */
  public static IdServiceBlockingV2Stub newBlockingV2Stub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<IdServiceBlockingV2Stub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<IdServiceBlockingV2Stub>() {
        @java.lang.Override
        public IdServiceBlockingV2Stub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new IdServiceBlockingV2Stub(channel, callOptions);
        }
      };
    return IdServiceBlockingV2Stub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports unary and streaming output calls on the service
   */
  public static IdServiceBlockingStub newBlockingStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<IdServiceBlockingStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<IdServiceBlockingStub>() {
        @java.lang.Override
        public IdServiceBlockingStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new IdServiceBlockingStub(channel, callOptions);
        }
      };
    return IdServiceBlockingStub.newStub(factory, channel);
  }

  /**
   * Creates a new ListenableFuture-style stub that supports unary calls on the service
   */
  public static IdServiceFutureStub newFutureStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<IdServiceFutureStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<IdServiceFutureStub>() {
        @java.lang.Override
        public IdServiceFutureStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new IdServiceFutureStub(channel, callOptions);
        }
      };
    return IdServiceFutureStub.newStub(factory, channel);
  }

  /**
   * <pre>
   * Issues ascending snowflake ids from the machine ids this server holds.
   * </pre>
   */
  public interface AsyncService {

    /**
     * <pre>
     * Returns `count` ids, strictly ascending, in one response.
     * count must be in [1, 100000]; otherwise INVALID_ARGUMENT.
     * UNAVAILABLE (retryable) while the server holds no valid lease, its clock
     * is behind its fence, or its clock stepped back further than it waits.
     * </pre>
     */
    default void nextIds(dev.snowkeep.v1.NextIdsRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.NextIdsResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getNextIdsMethod(), responseObserver);
    }

    /**
     * <pre>
     * Streams batches of ids; ids are strictly ascending across the whole
     * stream, which draws from one machine id. HTTP/2 flow control paces
     * generation: a slow reader is never sent ids it has not asked for.
     * batch_size must be in [0, 100000]; otherwise INVALID_ARGUMENT.
     * How a stream ends:
     * - OK only after exactly `total` ids. A stream with `total` = 0 never ends
     *   with OK: it runs until the client cancels it or the server ends it
     *   with an error.
     * - Any other end is an error status, sent after the last whole batch.
     *   Its message says how many ids were sent (and, for total &gt; 0, of how
     *   many asked) and what to do, e.g. "stream ended early: 4000 of 50000
     *   ids sent; this server is shutting down; ask for the remaining 46000
     *   ids on another snowkeep server". Every id sent before the status was
     *   delivered; ask for the rest (total minus the ids received) again.
     * - UNAVAILABLE (retryable: retry the rest on another server, or on this
     *   one once it is ready again): the server is shutting down (SIGTERM;
     *   this ends unbounded streams too), its lease or machine id was lost
     *   (holder key deleted, lease expired or revoked), its clock stepped
     *   back further than it waits out or is behind its fence, or its fence
     *   was not raised in time.
     * - FAILED_PRECONDITION (not retryable): the clock is past the last
     *   timestamp the layout can carry.
     * </pre>
     */
    default void streamIds(dev.snowkeep.v1.StreamIdsRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.IdBatch> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getStreamIdsMethod(), responseObserver);
    }
  }

  /**
   * Base class for the server implementation of the service IdService.
   * <pre>
   * Issues ascending snowflake ids from the machine ids this server holds.
   * </pre>
   */
  public static abstract class IdServiceImplBase
      implements io.grpc.BindableService, AsyncService {

    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {
      return IdServiceGrpc.bindService(this);
    }
  }

  /**
   * A stub to allow clients to do asynchronous rpc calls to service IdService.
   * <pre>
   * Issues ascending snowflake ids from the machine ids this server holds.
   * </pre>
   */
  public static final class IdServiceStub
      extends io.grpc.stub.AbstractAsyncStub<IdServiceStub> {
    private IdServiceStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected IdServiceStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new IdServiceStub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns `count` ids, strictly ascending, in one response.
     * count must be in [1, 100000]; otherwise INVALID_ARGUMENT.
     * UNAVAILABLE (retryable) while the server holds no valid lease, its clock
     * is behind its fence, or its clock stepped back further than it waits.
     * </pre>
     */
    public void nextIds(dev.snowkeep.v1.NextIdsRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.NextIdsResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getNextIdsMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Streams batches of ids; ids are strictly ascending across the whole
     * stream, which draws from one machine id. HTTP/2 flow control paces
     * generation: a slow reader is never sent ids it has not asked for.
     * batch_size must be in [0, 100000]; otherwise INVALID_ARGUMENT.
     * How a stream ends:
     * - OK only after exactly `total` ids. A stream with `total` = 0 never ends
     *   with OK: it runs until the client cancels it or the server ends it
     *   with an error.
     * - Any other end is an error status, sent after the last whole batch.
     *   Its message says how many ids were sent (and, for total &gt; 0, of how
     *   many asked) and what to do, e.g. "stream ended early: 4000 of 50000
     *   ids sent; this server is shutting down; ask for the remaining 46000
     *   ids on another snowkeep server". Every id sent before the status was
     *   delivered; ask for the rest (total minus the ids received) again.
     * - UNAVAILABLE (retryable: retry the rest on another server, or on this
     *   one once it is ready again): the server is shutting down (SIGTERM;
     *   this ends unbounded streams too), its lease or machine id was lost
     *   (holder key deleted, lease expired or revoked), its clock stepped
     *   back further than it waits out or is behind its fence, or its fence
     *   was not raised in time.
     * - FAILED_PRECONDITION (not retryable): the clock is past the last
     *   timestamp the layout can carry.
     * </pre>
     */
    public void streamIds(dev.snowkeep.v1.StreamIdsRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.IdBatch> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getStreamIdsMethod(), getCallOptions()), request, responseObserver);
    }
  }

  /**
   * A stub to allow clients to do synchronous rpc calls to service IdService.
   * <pre>
   * Issues ascending snowflake ids from the machine ids this server holds.
   * </pre>
   */
  public static final class IdServiceBlockingV2Stub
      extends io.grpc.stub.AbstractBlockingStub<IdServiceBlockingV2Stub> {
    private IdServiceBlockingV2Stub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected IdServiceBlockingV2Stub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new IdServiceBlockingV2Stub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns `count` ids, strictly ascending, in one response.
     * count must be in [1, 100000]; otherwise INVALID_ARGUMENT.
     * UNAVAILABLE (retryable) while the server holds no valid lease, its clock
     * is behind its fence, or its clock stepped back further than it waits.
     * </pre>
     */
    public dev.snowkeep.v1.NextIdsResponse nextIds(dev.snowkeep.v1.NextIdsRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getNextIdsMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Streams batches of ids; ids are strictly ascending across the whole
     * stream, which draws from one machine id. HTTP/2 flow control paces
     * generation: a slow reader is never sent ids it has not asked for.
     * batch_size must be in [0, 100000]; otherwise INVALID_ARGUMENT.
     * How a stream ends:
     * - OK only after exactly `total` ids. A stream with `total` = 0 never ends
     *   with OK: it runs until the client cancels it or the server ends it
     *   with an error.
     * - Any other end is an error status, sent after the last whole batch.
     *   Its message says how many ids were sent (and, for total &gt; 0, of how
     *   many asked) and what to do, e.g. "stream ended early: 4000 of 50000
     *   ids sent; this server is shutting down; ask for the remaining 46000
     *   ids on another snowkeep server". Every id sent before the status was
     *   delivered; ask for the rest (total minus the ids received) again.
     * - UNAVAILABLE (retryable: retry the rest on another server, or on this
     *   one once it is ready again): the server is shutting down (SIGTERM;
     *   this ends unbounded streams too), its lease or machine id was lost
     *   (holder key deleted, lease expired or revoked), its clock stepped
     *   back further than it waits out or is behind its fence, or its fence
     *   was not raised in time.
     * - FAILED_PRECONDITION (not retryable): the clock is past the last
     *   timestamp the layout can carry.
     * </pre>
     */
    @io.grpc.ExperimentalApi("https://github.com/grpc/grpc-java/issues/10918")
    public io.grpc.stub.BlockingClientCall<?, dev.snowkeep.v1.IdBatch>
        streamIds(dev.snowkeep.v1.StreamIdsRequest request) {
      return io.grpc.stub.ClientCalls.blockingV2ServerStreamingCall(
          getChannel(), getStreamIdsMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do limited synchronous rpc calls to service IdService.
   * <pre>
   * Issues ascending snowflake ids from the machine ids this server holds.
   * </pre>
   */
  public static final class IdServiceBlockingStub
      extends io.grpc.stub.AbstractBlockingStub<IdServiceBlockingStub> {
    private IdServiceBlockingStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected IdServiceBlockingStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new IdServiceBlockingStub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns `count` ids, strictly ascending, in one response.
     * count must be in [1, 100000]; otherwise INVALID_ARGUMENT.
     * UNAVAILABLE (retryable) while the server holds no valid lease, its clock
     * is behind its fence, or its clock stepped back further than it waits.
     * </pre>
     */
    public dev.snowkeep.v1.NextIdsResponse nextIds(dev.snowkeep.v1.NextIdsRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getNextIdsMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Streams batches of ids; ids are strictly ascending across the whole
     * stream, which draws from one machine id. HTTP/2 flow control paces
     * generation: a slow reader is never sent ids it has not asked for.
     * batch_size must be in [0, 100000]; otherwise INVALID_ARGUMENT.
     * How a stream ends:
     * - OK only after exactly `total` ids. A stream with `total` = 0 never ends
     *   with OK: it runs until the client cancels it or the server ends it
     *   with an error.
     * - Any other end is an error status, sent after the last whole batch.
     *   Its message says how many ids were sent (and, for total &gt; 0, of how
     *   many asked) and what to do, e.g. "stream ended early: 4000 of 50000
     *   ids sent; this server is shutting down; ask for the remaining 46000
     *   ids on another snowkeep server". Every id sent before the status was
     *   delivered; ask for the rest (total minus the ids received) again.
     * - UNAVAILABLE (retryable: retry the rest on another server, or on this
     *   one once it is ready again): the server is shutting down (SIGTERM;
     *   this ends unbounded streams too), its lease or machine id was lost
     *   (holder key deleted, lease expired or revoked), its clock stepped
     *   back further than it waits out or is behind its fence, or its fence
     *   was not raised in time.
     * - FAILED_PRECONDITION (not retryable): the clock is past the last
     *   timestamp the layout can carry.
     * </pre>
     */
    public java.util.Iterator<dev.snowkeep.v1.IdBatch> streamIds(
        dev.snowkeep.v1.StreamIdsRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getStreamIdsMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do ListenableFuture-style rpc calls to service IdService.
   * <pre>
   * Issues ascending snowflake ids from the machine ids this server holds.
   * </pre>
   */
  public static final class IdServiceFutureStub
      extends io.grpc.stub.AbstractFutureStub<IdServiceFutureStub> {
    private IdServiceFutureStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected IdServiceFutureStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new IdServiceFutureStub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns `count` ids, strictly ascending, in one response.
     * count must be in [1, 100000]; otherwise INVALID_ARGUMENT.
     * UNAVAILABLE (retryable) while the server holds no valid lease, its clock
     * is behind its fence, or its clock stepped back further than it waits.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dev.snowkeep.v1.NextIdsResponse> nextIds(
        dev.snowkeep.v1.NextIdsRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getNextIdsMethod(), getCallOptions()), request);
    }
  }

  private static final int METHODID_NEXT_IDS = 0;
  private static final int METHODID_STREAM_IDS = 1;

  private static final class MethodHandlers<Req, Resp> implements
      io.grpc.stub.ServerCalls.UnaryMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ServerStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ClientStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.BidiStreamingMethod<Req, Resp> {
    private final AsyncService serviceImpl;
    private final int methodId;

    MethodHandlers(AsyncService serviceImpl, int methodId) {
      this.serviceImpl = serviceImpl;
      this.methodId = methodId;
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public void invoke(Req request, io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        case METHODID_NEXT_IDS:
          serviceImpl.nextIds((dev.snowkeep.v1.NextIdsRequest) request,
              (io.grpc.stub.StreamObserver<dev.snowkeep.v1.NextIdsResponse>) responseObserver);
          break;
        case METHODID_STREAM_IDS:
          serviceImpl.streamIds((dev.snowkeep.v1.StreamIdsRequest) request,
              (io.grpc.stub.StreamObserver<dev.snowkeep.v1.IdBatch>) responseObserver);
          break;
        default:
          throw new AssertionError();
      }
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public io.grpc.stub.StreamObserver<Req> invoke(
        io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        default:
          throw new AssertionError();
      }
    }
  }

  public static final io.grpc.ServerServiceDefinition bindService(AsyncService service) {
    return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())
        .addMethod(
          getNextIdsMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dev.snowkeep.v1.NextIdsRequest,
              dev.snowkeep.v1.NextIdsResponse>(
                service, METHODID_NEXT_IDS)))
        .addMethod(
          getStreamIdsMethod(),
          io.grpc.stub.ServerCalls.asyncServerStreamingCall(
            new MethodHandlers<
              dev.snowkeep.v1.StreamIdsRequest,
              dev.snowkeep.v1.IdBatch>(
                service, METHODID_STREAM_IDS)))
        .build();
  }

  private static abstract class IdServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, io.grpc.protobuf.ProtoServiceDescriptorSupplier {
    IdServiceBaseDescriptorSupplier() {}

    @java.lang.Override
    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {
      return dev.snowkeep.v1.IdProto.getDescriptor();
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {
      return getFileDescriptor().findServiceByName("IdService");
    }
  }

  private static final class IdServiceFileDescriptorSupplier
      extends IdServiceBaseDescriptorSupplier {
    IdServiceFileDescriptorSupplier() {}
  }

  private static final class IdServiceMethodDescriptorSupplier
      extends IdServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {
    private final java.lang.String methodName;

    IdServiceMethodDescriptorSupplier(java.lang.String methodName) {
      this.methodName = methodName;
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.MethodDescriptor getMethodDescriptor() {
      return getServiceDescriptor().findMethodByName(methodName);
    }
  }

  private static volatile io.grpc.ServiceDescriptor serviceDescriptor;

  public static io.grpc.ServiceDescriptor getServiceDescriptor() {
    io.grpc.ServiceDescriptor result = serviceDescriptor;
    if (result == null) {
      synchronized (IdServiceGrpc.class) {
        result = serviceDescriptor;
        if (result == null) {
          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)
              .setSchemaDescriptor(new IdServiceFileDescriptorSupplier())
              .addMethod(getNextIdsMethod())
              .addMethod(getStreamIdsMethod())
              .build();
        }
      }
    }
    return result;
  }
}
